"""Neox-style rotary embedding applied in place to q and k, optionally fused with Qwen3's per-head
q/k RMSNorm before it and the KV-cache store after it.

A program per token and block of up to 16 q heads (a token's heads spread over several SMs, which
is what a decode step of a few tokens waits on); the first block of each token also takes its k
heads and the cache stores.
q, k and v may be strided views (sliced from the fused QKV output); only the last dimension must be
contiguous. The arithmetic mirrors the torch references (``layers/norm.py``, ``layers/rotary.py``):
the normalised row is rounded to the activation dtype before the weight multiply, cos/sin are
rounded to the activation dtype and each product and the sum are rounded to it, so bf16 results
match.

``norm_rope_store_`` is what a decoder layer runs on CUDA between the QKV projection and attention:
one launch instead of five (q norm, k norm, RoPE, K store, V store). Its norms are Llama's and
Qwen3's (the normalised row rounded, then times the weight) or Gemma's (``fp32_norm``: times the
weight, or ``1 + weight`` with ``offset``, in float32, rounded once), and Gemma 4's weightless v
norm (``v_norm_eps``: v normalised in place and so stored): six launches instead of one there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .pdl import wait_then_release


@triton.jit
def _norm_rotate_heads(ptr, tok, stride_t, stride_h, n_heads, c, s, w_ptr, eps,
                       HAS_NORM: tl.constexpr, FP32_NORM: tl.constexpr, OFFSET: tl.constexpr,
                       BLOCK_H: tl.constexpr, HALF: tl.constexpr, first=0):
    """Norm (optional; ``FP32_NORM``: the weight, ``1 + w`` with ``OFFSET``, multiplied in
    float32, one rounding) and rotate one token's heads ``first ..`` in place; return the
    rotated halves."""
    heads = first + tl.arange(0, BLOCK_H)
    cols = tl.arange(0, HALF)
    mask = (heads < n_heads)[:, None]
    p = ptr + tok * stride_t + heads[:, None] * stride_h + cols[None, :]
    dt = ptr.dtype.element_ty
    x1 = tl.load(p, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        rstd = tl.math.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        w1 = tl.load(w_ptr + cols).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + cols).to(tl.float32)[None, :]
        if FP32_NORM:
            if OFFSET:
                w1 = w1 + 1.0
                w2 = w2 + 1.0
            x1 = (x1 * rstd[:, None] * w1).to(dt).to(tl.float32)
            x2 = (x2 * rstd[:, None] * w2).to(dt).to(tl.float32)
        else:
            x1 = ((x1 * rstd[:, None]).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
            x2 = ((x2 * rstd[:, None]).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    o1 = ((x1 * c).to(dt).to(tl.float32) - (x2 * s).to(dt).to(tl.float32)).to(dt)
    o2 = ((x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)).to(dt)
    tl.store(p, o1, mask=mask)
    tl.store(p + HALF, o2, mask=mask)
    return o1, o2


@triton.jit
def _to_cache(x, inv_scale, dst_ptr, FP8: tl.constexpr):
    """A value for the KV cache: as is, or divided by the layer's scale and saturated into e4m3."""
    if FP8:
        x = tl.minimum(tl.maximum(x.to(tl.float32) * inv_scale, -448.0), 448.0)
    return x.to(dst_ptr.dtype.element_ty)


@triton.jit
def _copy_heads(src, src_off, stride_h, dst, dst_off, dst_stride_h, n_heads, inv_scale, eps,
                BLOCK_H: tl.constexpr, DIM: tl.constexpr, FP8: tl.constexpr,
                NORM: tl.constexpr):
    """Heads of ``src`` into the cache ``dst``; with ``NORM``, RMS-normalised first (no weight,
    float32, one rounding) and so written back in place too."""
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, DIM)
    mask = (heads < n_heads)[:, None]
    src_ptrs = src + src_off + heads[:, None] * stride_h + cols[None, :]
    x = tl.load(src_ptrs, mask=mask)
    if NORM:
        xf = x.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=1) / DIM + eps)
        x = (xf * rstd[:, None]).to(src.dtype.element_ty)
        tl.store(src_ptrs, x, mask=mask)
    tl.store(dst + dst_off + heads[:, None] * dst_stride_h + cols[None, :],
             _to_cache(x, inv_scale, dst, FP8), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, cache_ptr, qw_ptr, kw_ptr, kc_ptr, vc_ptr, loc_ptr,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h,
    c_stride_slot, c_stride_h, n_q, n_k, cache_stride, eps, v_eps, k_inv_scale, v_inv_scale,
    HAS_NORM: tl.constexpr, FP32_NORM: tl.constexpr, OFFSET: tl.constexpr,
    V_NORM: tl.constexpr, STORE: tl.constexpr, FP8: tl.constexpr,
    HALF: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_then_release(USE_PDL)
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cols = tl.arange(0, HALF)
    dt = q_ptr.dtype.element_ty
    c = tl.load(cache_ptr + pos * cache_stride + cols).to(dt).to(tl.float32)[None, :]
    s = tl.load(cache_ptr + pos * cache_stride + HALF + cols).to(dt).to(tl.float32)[None, :]
    block = tl.program_id(1)
    _norm_rotate_heads(q_ptr, tok, q_stride_t, q_stride_h, n_q, c, s, qw_ptr, eps,
                       HAS_NORM, FP32_NORM, OFFSET, BLOCK_Q, HALF, block * BLOCK_Q)
    if block != 0:
        return
    k1, k2 = _norm_rotate_heads(k_ptr, tok, k_stride_t, k_stride_h, n_k, c, s, kw_ptr, eps,
                                HAS_NORM, FP32_NORM, OFFSET, BLOCK_K, HALF)
    if STORE:
        slot = tl.load(loc_ptr + tok).to(tl.int64)
        heads = tl.arange(0, BLOCK_K)
        mask = (heads < n_k)[:, None]
        kc = kc_ptr + slot * c_stride_slot + heads[:, None] * c_stride_h + cols[None, :]
        tl.store(kc, _to_cache(k1, k_inv_scale, kc_ptr, FP8), mask=mask)
        tl.store(kc + HALF, _to_cache(k2, k_inv_scale, kc_ptr, FP8), mask=mask)
        _copy_heads(v_ptr, tok * v_stride_t, v_stride_h, vc_ptr, slot * c_stride_slot, c_stride_h,
                    n_k, v_inv_scale, v_eps, BLOCK_K, 2 * HALF, FP8, V_NORM)


def _check(q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor) -> None:
    tokens, _, dim = q.shape
    assert k.shape[0] == tokens and k.shape[2] == dim and cos_sin.shape[1] == dim
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin.stride(-1) == 1
    assert dim % 2 == 0 and triton.next_power_of_2(dim) == dim, "head_dim must be a power of two"
    assert q.dtype == k.dtype


def _launch(positions, q, k, v, cos_sin, q_weight, k_weight, eps, k_cache, v_cache, out_loc,
            kv_scales=(1.0, 1.0), pdl=False, fp32_norm=False, offset=False, v_norm_eps=None):
    tokens, n_q, dim = q.shape
    n_k = k.shape[1]
    if tokens == 0:
        return
    has_norm, store = q_weight is not None, k_cache is not None
    block_q, block_k = min(16, triton.next_power_of_2(n_q)), triton.next_power_of_2(n_k)
    warps = 4 if max(block_q, block_k) * dim <= 4096 else 8
    _rope_kernel[(tokens, triton.cdiv(n_q, block_q))](
        q, k, v if store else q, positions, cos_sin,
        q_weight if has_norm else q, k_weight if has_norm else q,
        k_cache if store else q, v_cache if store else q, out_loc if store else positions,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        v.stride(0) if store else 0, v.stride(1) if store else 0,
        k_cache.stride(0) if store else 0, k_cache.stride(1) if store else 0,
        n_q, n_k, cos_sin.stride(0), eps, v_norm_eps or 0.0, 1.0 / kv_scales[0],
        1.0 / kv_scales[1], HAS_NORM=has_norm, FP32_NORM=fp32_norm, OFFSET=offset,
        V_NORM=v_norm_eps is not None, STORE=store,
        FP8=store and k_cache.dtype == torch.float8_e4m3fn,
        HALF=dim // 2, BLOCK_Q=block_q, BLOCK_K=block_k,
        num_warps=warps, **pdl_.launch_options(q, pdl),
    )


def apply_rope_(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                cos_sin: torch.Tensor, pdl: bool = False) -> None:
    """Rotate q [T, Hq, D] and k [T, Hk, D] in place. ``cos_sin`` is [max_pos, D]: cos | sin halves
    (float32), ``positions`` [T] integer. D must be a power of two (64, 128, 256 in practice)."""
    _check(q, k, cos_sin)
    _launch(positions, q, k, None, cos_sin, None, None, 0.0, None, None, None, pdl=pdl)


def norm_rope_store_(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cos_sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor,
    q_weight: torch.Tensor | None = None, k_weight: torch.Tensor | None = None, eps: float = 0.0,
    kv_scales: tuple[float, float] = (1.0, 1.0), pdl: bool = False, fp32_norm: bool = False,
    offset: bool = False, v_norm_eps: float | None = None,
) -> None:
    """q/k: per-head RMSNorm with ``q_weight``/``k_weight`` (when given; ``fp32_norm``,
    ``offset``: Gemma's variants, the module docstring), then RoPE, in place; v normalised in
    place where ``v_norm_eps`` is given (no weight); then rotated k and v [T, Hk, D] go to slots
    ``out_loc`` [T] of ``k_cache``/``v_cache`` [slots, Hk, D]. An FP8 cache (float8_e4m3fn)
    stores ``k / kv_scales[0]`` and ``v / kv_scales[1]``, saturated."""
    _check(q, k, cos_sin)
    assert v.shape == k.shape and v.stride(-1) == 1 and out_loc.shape == (q.shape[0],)
    assert k_cache.shape[1:] == k.shape[1:] and v_cache.stride() == k_cache.stride()
    assert k_cache.stride(-1) == 1 and v.dtype == k.dtype and v_cache.dtype == k_cache.dtype
    assert k_cache.dtype in (k.dtype, torch.float8_e4m3fn)
    assert (q_weight is None) == (k_weight is None)
    assert not (offset and not fp32_norm), "an offset norm multiplies in float32"
    _launch(positions, q, k, v, cos_sin, q_weight, k_weight, eps, k_cache, v_cache, out_loc,
            kv_scales, pdl, fp32_norm, offset, v_norm_eps)
