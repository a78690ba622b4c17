"""Prefill/extend attention over the paged KV cache: causal, with a cached prefix.

The queries are the new tokens of each request, packed back to back; the keys are the request's
whole context ``[0, seq_len)`` read through the page table. The new tokens' K/V were stored before
the call, so prefix and new keys are read the same way. Token ``i`` of a request sits at position
``cached_len + i`` (``cached_len = seq_len - extend_len``) and sees keys ``0 ..= cached_len + i``::

    q  [T, Hq, D]   cu_seqlens [B+1]:  |-- req 0 new --|-- req 1 new --|...
    page_table[rows[b], p] -> slot of position p;  k_cache / v_cache [num_slots, Hkv, D]

    keys of request b:  0 ............ cached_len .............. seq_len
                        |  prefix: all visible  | new: causal (k <= q) |

    grid: (cdiv(max_extend, BLOCK_M), B, Hq); program (m, b, h) owns query rows
    [m*BLOCK_M, (m+1)*BLOCK_M) of request b and loops over keys in two passes:
        [0, mid)    mid = cached_len + m*BLOCK_M: visible to every row, no causal mask
        [mid, end)  end = cached_len + (m+1)*BLOCK_M: the diagonal, masked key <= query

A sliding window (``window > 0``: a query at ``p`` sees keys ``p - window < k <= p``) starts the
first pass at the block's lowest visible key, ``cached_len + m*BLOCK_M - window + 1``, and masks per
row in both passes. Image blocks (``key_limits``: per query token the last key it sees, an
image's last token for the image's tokens) replace ``k <= p`` by ``k <= limit`` and end the
second pass at the block's largest limit. Sinks (one logit per query head, natural units) join
each row's denominator at the end: ``l += 2^(sink * log2(e) - m)``; they carry no value.

``max_extend`` is a host-side bound (the scheduler knows every request's extend length); programs
past a request's end do no work. Online softmax in the log2 domain, fp32 accumulation.

An FP8 cache (``float8_e4m3fn``) is read as e4m3 and converted to q's dtype in registers, half the
bytes of a bf16 cache; its per-layer scales never touch the tiles: ``k_scale`` is folded into the
softmax scale and ``v_scale`` multiplies the normalised output (``kv_scales``, host floats).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["extend_attention"]

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_keys(
    acc, m_i, l_i, q, q_pos, q_lim, K, V, pt_row, kvh, start, end, qk_scale,
    stride_kn, stride_kh, stride_vn, stride_vh, d_mask, window,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr,
    WINDOWED: tl.constexpr = False,
):
    """Online softmax over keys [start, end); CAUSAL adds the mask ``key <= q_lim`` (the query's
    position, or its image's end), WINDOWED the mask ``key > query position - window``. A row
    may see no key of a block (a window): its exponents are taken against 0 instead of a -inf
    maximum, so it stays 0, not NaN."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    for n in range(start, end, BLOCK_N):
        pos = n + offs_n
        valid = pos < end
        slot = tl.load(pt_row + pos, mask=valid, other=0).to(tl.int64)
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(K + slot[:, None] * stride_kn + kvh * stride_kh + offs_d[None, :], mask=kv_mask,
                    other=0.0).to(q.dtype)
        v = tl.load(V + slot[:, None] * stride_vn + kvh * stride_vh + offs_d[None, :], mask=kv_mask,
                    other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
        seen = valid[None, :]
        if CAUSAL:
            seen = seen & (pos[None, :] <= q_lim[:, None])
        if WINDOWED:
            seen = seen & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _extend_kernel(
    Q, K, V, Out, PageTable, Rows, CuSeqlens, SeqLens, Sinks, Limits,
    qk_scale, v_scale, window,
    stride_qt, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_ot, stride_oh,
    stride_pt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr,
    WINDOWED: tl.constexpr, HAS_SINKS: tl.constexpr, BLOCKS: tl.constexpr,
):
    mb = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // GROUP
    q_begin = tl.load(CuSeqlens + b)
    ext = tl.load(CuSeqlens + b + 1) - q_begin
    seq_len = tl.load(SeqLens + b)
    cached = seq_len - ext
    row = tl.load(Rows + b).to(tl.int64)

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < ext
    d_mask = offs_d < HEAD_DIM
    q_rows = (q_begin + offs_m).to(tl.int64)
    q = tl.load(
        Q + q_rows[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :], other=0.0,
    )
    q_pos = cached + offs_m
    q_lim = q_pos
    # keys [0, mid) are visible to every row of the block (no causal mask needed), [mid, end) are
    # the diagonal; a block past the request's end loops zero times
    end = tl.minimum(seq_len, cached + (mb + 1) * BLOCK_M)
    if BLOCKS:  # an image's tokens see up to its last
        q_lim = tl.load(Limits + q_rows, mask=m_mask, other=0)
        end = tl.minimum(seq_len, tl.max(tl.where(m_mask, q_lim, 0), 0) + 1)
    end = tl.where(mb * BLOCK_M < ext, end, 0)
    mid = tl.minimum(cached + mb * BLOCK_M, end)
    lo = 0
    if WINDOWED:  # keys below the block's first row's window are seen by no row
        lo = tl.maximum(cached + mb * BLOCK_M - window + 1, 0)
        lo = tl.minimum(lo, mid)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pt_row = PageTable + row * stride_pt
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, q_pos, q_lim, K, V, pt_row, kvh, lo, mid, qk_scale,
        stride_kn, stride_kh, stride_vn, stride_vh, d_mask, window, BLOCK_N, BLOCK_D, False,
        DOT_PREC, WINDOWED,
    )
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, q_pos, q_lim, K, V, pt_row, kvh, mid, end, qk_scale,
        stride_kn, stride_kh, stride_vn, stride_vh, d_mask, window, BLOCK_N, BLOCK_D, True,
        DOT_PREC, WINDOWED,
    )

    if HAS_SINKS:  # rows that saw a key (m finite) add the sink to their denominator
        sink = tl.load(Sinks + h).to(tl.float32) * 1.4426950408889634
        l_i += tl.where(m_i > float("-inf"), tl.exp2(sink - m_i), 0.0)
    l_i = tl.where(l_i > 0, l_i, 1.0)  # rows of an idle block: never stored, kept finite
    o_ptr = Out + q_rows[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    out = acc * (v_scale / l_i)[:, None]
    tl.store(o_ptr, out.to(Out.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


def _launch_config(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): 64/64/4/3 is within 6% of the best of six
    configurations in every prefill case swept on an H100 (bf16, D=128, benchmark/kernels)."""
    if dtype == torch.float32:
        return 32, 32, 4, 2
    if head_dim > 128:
        return 64, 32, 4, 2
    return 64, 64, 4, 3


def extend_attention(
    q: torch.Tensor,  # [T, Hq, D] new tokens, requests back to back
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    page_table: torch.Tensor,  # [rows_total, max_seq] int32 slots
    rows: torch.Tensor,  # [B] int32 page-table row of each request
    cu_seqlens: torch.Tensor,  # [B+1] int32 offsets of each request's new tokens in q
    seq_lens: torch.Tensor,  # [B] int32 context length incl. the new tokens
    max_extend: int,  # host-side bound on the new tokens of any request (sizes the grid)
    scale: float,
    out: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    window: int = 0,  # > 0: each query sees its last ``window`` positions only
    sinks: torch.Tensor | None = None,  # [Hq] one logit per query head in the denominator
    key_limits: torch.Tensor | None = None,  # [T] int32: the last key each query sees
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its paged context -> ``[T, Hq, D]``.
    ``kv_scales``: (k_scale, v_scale) of an FP8 cache (stored value * scale = K, V)."""
    assert sinks is None or sinks.shape == (q.shape[1],), "sinks: one logit per query head"
    total, hq, dim = q.shape
    hkv = k_cache.shape[1]
    assert hq % hkv == 0, f"query heads {hq} not a multiple of KV heads {hkv}"
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    cfg = _launch_config(dim, q.dtype)
    block_m, block_n = block_m or cfg[0], block_n or cfg[1]
    num_warps, num_stages = num_warps or cfg[2], num_stages or cfg[3]
    if out is None:
        out = torch.empty(total, hq, dim, dtype=q.dtype, device=q.device)
    num_reqs = rows.shape[0]
    if total == 0 or num_reqs == 0 or max_extend <= 0:
        return out
    grid = (triton.cdiv(max_extend, block_m), num_reqs, hq)
    _extend_kernel[grid](
        q, k_cache, v_cache, out, page_table, rows, cu_seqlens, seq_lens,
        rows if sinks is None else sinks, rows if key_limits is None else key_limits,
        scale * _LOG2E * kv_scales[0], kv_scales[1], window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1), page_table.stride(0),
        GROUP=hq // hkv, HEAD_DIM=dim, BLOCK_D=max(16, triton.next_power_of_2(dim)),
        BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32",
        WINDOWED=window > 0, HAS_SINKS=sinks is not None, BLOCKS=key_limits is not None,
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
