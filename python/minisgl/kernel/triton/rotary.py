"""Neox-style rotary embedding applied in place to q and k.

One program per token: the token's cos/sin row is read once and applied to all its q and k heads.
q and k may be strided views (sliced from the fused QKV output); only the last dimension must be
contiguous. The arithmetic mirrors the torch reference (``layers/rotary.py``): cos/sin are rounded to
the activation dtype and each product and the sum are rounded to it, so bf16 results match.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(ptr, tok, stride_t, stride_h, n_heads, c, s,
                  BLOCK_H: tl.constexpr, HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, HALF)
    mask = (heads < n_heads)[:, None]
    p = ptr + tok * stride_t + heads[:, None] * stride_h + cols[None, :]
    x1 = tl.load(p, mask=mask, other=0.0)
    x2 = tl.load(p + HALF, mask=mask, other=0.0)
    dt = ptr.dtype.element_ty
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    o1 = (x1 * c).to(dt).to(tl.float32) - (x2 * s).to(dt).to(tl.float32)
    o2 = (x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)
    tl.store(p, o1.to(dt), mask=mask)
    tl.store(p + HALF, o2.to(dt), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, n_q, n_k, cache_stride,
    HALF: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cols = tl.arange(0, HALF)
    dt = q_ptr.dtype.element_ty
    c = tl.load(cache_ptr + pos * cache_stride + cols).to(dt).to(tl.float32)[None, :]
    s = tl.load(cache_ptr + pos * cache_stride + HALF + cols).to(dt).to(tl.float32)[None, :]
    _rotate_heads(q_ptr, tok, q_stride_t, q_stride_h, n_q, c, s, BLOCK_Q, HALF)
    _rotate_heads(k_ptr, tok, k_stride_t, k_stride_h, n_k, c, s, BLOCK_K, HALF)


def apply_rope_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                cos_sin: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place. ``cos_sin`` is [max_pos, D]: cos | sin halves
    (float32), ``positions`` [T] integer. D must be a power of two (64, 128, 256 in practice)."""
    tokens, n_q, dim = q.shape
    assert k.shape[0] == tokens and k.shape[2] == dim and cos_sin.shape[1] == dim
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin.stride(-1) == 1
    assert dim % 2 == 0 and triton.next_power_of_2(dim) == dim, "head_dim must be a power of two"
    assert q.dtype == k.dtype
    if tokens == 0:
        return
    block_q, block_k = triton.next_power_of_2(n_q), triton.next_power_of_2(k.shape[1])
    warps = 4 if block_q * dim <= 4096 else 8
    _rope_kernel[(tokens,)](
        q, k, positions, cos_sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        n_q, k.shape[1], cos_sin.stride(0),
        HALF=dim // 2, BLOCK_Q=block_q, BLOCK_K=block_k, num_warps=warps,
    )
