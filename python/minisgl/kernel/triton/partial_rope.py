"""The q/k preparation of the hybrid models' gated attention (``layers/attention.py``) in
one launch: each head's ``(1 + w)`` RMSNorm, then neox RoPE on its first ``rotary_dim`` dims, the
rest passed through; q and k come out contiguous.

One program per token. The arithmetic mirrors the torch reference step by step: the norm in fp32
rounded once to the activation dtype, cos/sin rounded to it, each rotary product and the sum
rounded to it (what transformers' ``apply_rotary_pos_emb`` does on bf16 tensors).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_rope_heads(src, stride_h, dst, n_heads, w_ptr, c, s, eps,
                     D: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    dt = dst.dtype.element_ty
    heads = tl.arange(0, BLOCK_H)
    hm = (heads < n_heads)[:, None]
    cols = tl.arange(0, D)
    x = tl.load(src + heads[:, None] * stride_h + cols[None, :], mask=hm, other=0.0)
    x = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
    w = tl.load(w_ptr + cols).to(tl.float32)[None, :]
    y = (x * rstd * (1.0 + w)).to(dt)
    # the rotated dims, read again as their two halves (registers cannot be sliced)
    half = tl.arange(0, HALF)
    x1 = tl.load(src + heads[:, None] * stride_h + half[None, :], mask=hm, other=0.0)
    x2 = tl.load(src + heads[:, None] * stride_h + HALF + half[None, :], mask=hm, other=0.0)
    w1 = tl.load(w_ptr + half).to(tl.float32)[None, :]
    w2 = tl.load(w_ptr + HALF + half).to(tl.float32)[None, :]
    n1 = (x1.to(tl.float32) * rstd * (1.0 + w1)).to(dt).to(tl.float32)
    n2 = (x2.to(tl.float32) * rstd * (1.0 + w2)).to(dt).to(tl.float32)
    o1 = ((n1 * c).to(dt).to(tl.float32) - (n2 * s).to(dt).to(tl.float32)).to(dt)
    o2 = ((n2 * c).to(dt).to(tl.float32) + (n1 * s).to(dt).to(tl.float32)).to(dt)
    out = dst + heads[:, None] * D
    tl.store(out + cols[None, :], y, mask=hm & (cols >= 2 * HALF)[None, :])
    tl.store(out + half[None, :], o1, mask=hm)
    tl.store(out + HALF + half[None, :], o2, mask=hm)


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_cos, n_q, n_k, eps,
                         D: tl.constexpr, HALF: tl.constexpr, BLOCK_Q: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    half = tl.arange(0, HALF)
    dt = qo_ptr.dtype.element_ty
    c = tl.load(cos_ptr + pos * stride_cos + half).to(dt).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + pos * stride_cos + half).to(dt).to(tl.float32)[None, :]
    _norm_rope_heads(q_ptr + tok * stride_qt, stride_qh, qo_ptr + tok * n_q * D, n_q, qw_ptr, c,
                     s, eps, D, HALF, BLOCK_Q)
    _norm_rope_heads(k_ptr + tok * stride_kt, stride_kh, ko_ptr + tok * n_k * D, n_k, kw_ptr, c,
                     s, eps, D, HALF, BLOCK_K)


def qk_norm_partial_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                         cos: torch.Tensor, sin: torch.Tensor, q_weight: torch.Tensor,
                         k_weight: torch.Tensor, eps: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """q ``[T, Hq, D]``, k ``[T, Hk, D]`` (strided views; the last dim contiguous), cos/sin
    ``[max_pos, R / 2]`` fp32 for the rotated ``R`` dims, the norms' zero-centred weights ``[D]``.
    Returns new contiguous (q, k)."""
    tokens, n_q, dim = q.shape
    n_k, half = k.shape[1], cos.shape[1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos.stride() == sin.stride()
    assert triton.next_power_of_2(dim) == dim and triton.next_power_of_2(half) == half
    q_out, k_out = torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format)
    if tokens:
        block_q = triton.next_power_of_2(n_q)
        _qk_norm_rope_kernel[(tokens,)](
            q, k, q_out, k_out, positions, cos, sin, q_weight, k_weight, q.stride(0),
            q.stride(1), k.stride(0), k.stride(1), cos.stride(0), n_q, n_k, eps, D=dim,
            HALF=half, BLOCK_Q=block_q, BLOCK_K=triton.next_power_of_2(n_k),
            num_warps=8 if block_q * dim > 4096 else 4)
    return q_out, k_out
