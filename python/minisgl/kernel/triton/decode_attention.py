"""Paged split-K ("flash-decoding") attention for decode: one query token per request.

Decode is memory-bound: every step reads each request's whole K/V once and does almost no math. Two
things make it fast. (1) GQA grouping: the ``GROUP = Hq / Hkv`` query heads that share a KV head are
one program, so each K/V row is read once per KV head (not once per query head) and the scores are a
small matrix product ``[GROUP_PAD, D] x [D, BLOCK_N]`` on the tensor cores. (2) Split-K: a batch of
few requests has too few (request, KV head) pairs to fill the GPU, so the context is cut into
``num_splits`` chunks that run in parallel; stage 2 merges their partial results by log-sum-exp.

Index layout (per-token slots, so the page size never reaches the kernel)::

    page_table [rows_total, max_seq]   slot of position p of request r = page_table[rows[r], p]
    k_cache / v_cache [num_slots, Hkv, D]

    grid stage 1: (Hkv, B, S)                          chunk = roundup(cdiv(seq_len, S), BLOCK_N)
      request b: |-- split 0 --|-- split 1 --|-- ... --|-- split S-1 --|  (tail splits may be empty)
      program (h, i, s): b = order[i], q[b, h*GROUP : (h+1)*GROUP, :]  (rows >= GROUP: zero padding)
    workspace: part_out [B, Hq, S, D] fp32, part_lse [B, Hq, S] fp32 (log2 domain)
    grid stage 2: (B, Hq)  out[b, h] = sum_s 2^(lse_s - max) * part_out_s / sum_s 2^(lse_s - max)

A sliding window (``window > 0``) only moves the range the splits share: keys
``[max(0, seq_len - window), seq_len)`` instead of ``[0, seq_len)``. Sinks (one logit per query
head) join the denominator where the output is normalised: stage 1 with one split, else stage 2,
``out = sum_s 2^lse_s part_s / (2^(sink * log2(e)) + sum_s 2^lse_s)``.

Launch order: the GPU starts programs in grid order, the first dimension fastest, and a batch
of decode requests has far more programs than the GPU holds at once. Two choices fill it to the
end. The KV heads of a request are neighbours (``h`` is the fast dimension), so they run together
and read the same slots' rows; and ``order`` (the caller's, from host-side lengths) lists the
requests longest first, so the long programs start early and the short ones fill the gaps at the
end instead of one long request running alone after everything else (the classic longest-first
list schedule); on an H100 this keeps a batch of spread lengths within 1-2% of a kernel that only
reads the same K/V (docs/performance.md). Each program computes the same thing in any order, so
the order never changes a bit of the output.

Nothing about the launch depends on device data (lengths are read on the device and ``num_splits``
is the caller's choice from host-side bounds), so the whole thing can be captured in a CUDA graph.
With ``num_splits == 1`` stage 1 writes the normalised output directly and stage 2 is skipped.
``num_splits`` is a runtime argument, so every split count shares one compiled kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .extend_attention import _attend_keys
from .pdl import wait_then_release

__all__ = ["choose_num_splits", "decode_attention", "decode_workspace", "longest_first"]

_LOG2E = 1.4426950408889634
MAX_SPLITS = 32


# the split count and the strides it sets are runtime values (one variant for every count); the
# int32 metadata vectors are read one entry per program, whatever their alignment (the CUDA
# graphs' are rows of one flat buffer, aligned only for some batch sizes)
@triton.jit(do_not_specialize=["num_splits", "stride_pb", "stride_ph", "stride_lb", "stride_lh"],
            do_not_specialize_on_alignment=["Rows", "SeqLens", "Order", "Sinks"])
def _decode_stage1(
    Q, K, V, PageTable, Rows, SeqLens, Order, PartOut, PartLse, Out, Sinks,
    qk_scale,  # softmax scale * log2(e) (* k_scale of an FP8 cache): scores in the log2 domain
    v_scale,  # of an FP8 cache (1.0 otherwise): multiplies the normalised output
    num_splits,  # a runtime value (one compiled kernel for all); DIRECT marks num_splits == 1
    window,  # > 0: the last ``window`` keys only
    stride_qb, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_pt,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, DOT_PREC: tl.constexpr, HAS_ORDER: tl.constexpr,
    USE_PDL: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    wait_then_release(USE_PDL)
    kvh = tl.program_id(0)
    b = tl.load(Order + tl.program_id(1)) if HAS_ORDER else tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(SeqLens + b)
    row = tl.load(Rows + b).to(tl.int64)
    lo = _window_start(seq_len, window)
    chunk = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :], other=0.0,
    )
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    pt_row = PageTable + row * stride_pt
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, offs_g, offs_g, K, V, pt_row, kvh, start, end, qk_scale,
        stride_kn, stride_kh, stride_vn, stride_vh, d_mask, 0,
        BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, CAUSAL=False, DOT_PREC=DOT_PREC,
    )

    out_mask = g_mask[:, None] & d_mask[None, :]
    if DIRECT:
        if HAS_SINKS:
            sink = tl.load(Sinks + heads, mask=g_mask, other=0.0).to(tl.float32)
            l_i += tl.where(g_mask, tl.exp2(sink * 1.4426950408889634 - m_i), 0.0)
        o_ptr = Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptr, (acc * (v_scale / l_i)[:, None]).to(Out.dtype.element_ty), mask=out_mask)
    else:
        # an empty split leaves its slot unwritten: stage 2 never reads it
        g_mask = g_mask & (start + offs_g * 0 < end)
        l_i = tl.where(l_i > 0, l_i, 1.0)
        po = (PartOut + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps
              + offs_d[None, :])
        tl.store(po, acc * (v_scale / l_i)[:, None], mask=g_mask[:, None] & d_mask[None, :])
        pl = PartLse + b * stride_lb + heads * stride_lh + split
        tl.store(pl, m_i + tl.log2(l_i), mask=g_mask)


@triton.jit
def _window_start(seq_len, window):
    """The first key the new token (position ``seq_len - 1``) sees."""
    return tl.where(window > 0, tl.maximum(seq_len - window, 0), 0)


@triton.jit(do_not_specialize=["num_splits", "stride_pb", "stride_ph", "stride_lb", "stride_lh"],
            do_not_specialize_on_alignment=["SeqLens", "Sinks"])
def _decode_stage2(
    PartOut, PartLse, SeqLens, Out, Sinks, num_splits, window,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS_PAD: tl.constexpr,
    USE_PDL: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    wait_then_release(USE_PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(SeqLens + b)
    span = seq_len - _window_start(seq_len, window)
    chunk = tl.cdiv(tl.cdiv(span, num_splits), BLOCK_N) * BLOCK_N
    used = tl.cdiv(span, chunk)  # splits that stage 1 wrote (the same arithmetic)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < used
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(
        PartLse + b * stride_lb + h * stride_lh + offs_s, mask=s_mask, other=float("-inf"),
    )
    w = tl.exp2(lse - tl.max(lse, 0))
    w = tl.where(s_mask, w, 0.0)
    part = tl.load(
        PartOut + b * stride_pb + h * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :], other=0.0,
    )
    denom = tl.sum(w, 0)
    if HAS_SINKS:
        sink = tl.load(Sinks + h).to(tl.float32) * 1.4426950408889634  # log2 domain
        denom += tl.exp2(sink - tl.max(lse, 0))
    out = tl.sum(part * w[:, None], 0) / denom
    tl.store(
        Out + b * stride_ob + h * stride_oh + offs_d, out.to(Out.dtype.element_ty), mask=d_mask,
    )


def choose_num_splits(batch_size: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
                      block_n: int = 64) -> int:
    """Splits per request so that ``batch * kv_heads * splits`` is about two programs per SM.

    With >= 2 programs per SM a split only adds the stage-2 pass, while a lone request needs
    16-32 splits to fill the GPU (``bench_decode_attention.py --sweep`` on an H100). Depends on
    host-side bounds only (``max_seq_len`` may be the engine's maximum), so a CUDA graph captured
    for a batch size stays valid for any lengths; surplus splits of short requests are empty and
    cost one early-out program each.
    """
    want = (2 * num_sms) // max(1, batch_size * num_kv_heads)
    return max(1, min(want, MAX_SPLITS, -(-max_seq_len // block_n)))


def longest_first(seq_lens: list[int]) -> list[int]:
    """The batch's indices, longest context first (ties in batch order): ``decode_attention``'s
    ``order``."""
    return sorted(range(len(seq_lens)), key=lambda i: -seq_lens[i])


def decode_workspace(batch_size: int, num_qo_heads: int, num_splits: int, head_dim: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage-1 partial results: out ``[B, Hq, S, D]`` and log2-sum-exp ``[B, Hq, S]`` (fp32)."""
    part_out = torch.empty(batch_size, num_qo_heads, num_splits, head_dim, dtype=torch.float32,
                           device=device)
    part_lse = torch.empty(batch_size, num_qo_heads, num_splits, dtype=torch.float32, device=device)
    return part_out, part_lse


def _launch_config(head_dim: int, dtype: torch.dtype, kv_dtype: torch.dtype,
                   num_splits: int) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages), the fastest of a sweep on an H100 at D=128
    (``benchmark/kernels/bench_decode_attention.py --sweep``). A 16-bit cache: 128/4/2 with one
    split (long chunks amortise each tile's loads); 64/4/3 with splits, whose chunks may be short.
    An FP8 cache reads half the bytes per tile, so twice the rows: 128/4/3."""
    if dtype == torch.float32 or head_dim > 128:
        return 32, 4, 2
    if kv_dtype == torch.float8_e4m3fn:
        return 128, 4, 3
    return (128, 4, 2) if num_splits == 1 else (64, 4, 3)


def decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_slots, Hkv, D]
    v_cache: torch.Tensor,  # [num_slots, Hkv, D]
    page_table: torch.Tensor,  # [rows_total, max_seq] int32 slots
    rows: torch.Tensor,  # [B] int32: the page-table row of each request
    seq_lens: torch.Tensor,  # [B] int32: context length incl. the new token (>= 1)
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,  # [B, Hq, D]
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    kv_scales: tuple[float, float] = (1.0, 1.0),
    order: torch.Tensor | None = None,  # [B] int32: the requests longest first (``longest_first``)
    pdl: bool = False,  # launch with programmatic dependent launch (``pdl.py``)
    window: int = 0,  # > 0: the new token sees its last ``window`` positions only
    sinks: torch.Tensor | None = None,  # [Hq] one logit per query head in the denominator
) -> torch.Tensor:
    """Attention of one new token per request over its paged context ``[0, seq_len)``.
    ``kv_scales``: (k_scale, v_scale) of an FP8 cache, read as ``extend_attention`` reads it.
    ``order``: a permutation of the batch, the order in which its programs start (None: batch
    order); the output is the same in any order.

    ``workspace`` (from ``decode_workspace``, at least ``[B, Hq, num_splits, D]``) may be passed
    to keep allocations out of the call, e.g. a static buffer under CUDA graphs.
    """
    bs, hq, dim = q.shape
    hkv = k_cache.shape[1]
    assert hq % hkv == 0, f"query heads {hq} not a multiple of KV heads {hkv}"
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    group = hq // hkv
    num_splits = max(1, int(num_splits))
    cfg_n, cfg_w, cfg_s = _launch_config(dim, q.dtype, k_cache.dtype, num_splits)
    block_n, num_warps, num_stages = block_n or cfg_n, num_warps or cfg_w, num_stages or cfg_s
    if out is None:
        out = torch.empty(bs, hq, dim, dtype=q.dtype, device=q.device)
    if bs == 0:
        return out
    if num_splits > 1:
        if workspace is None:
            workspace = decode_workspace(bs, hq, num_splits, dim, q.device)
        part_out, part_lse = workspace
        assert part_out.shape[0] >= bs and part_out.shape[2] >= num_splits
    else:
        part_out = part_lse = out  # unused: with one split stage 1 writes ``out``
    block_d = max(16, triton.next_power_of_2(dim))  # tl.dot needs K >= 16
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
    launch = pdl_.launch_options(q, pdl)
    assert order is None or order.shape == (bs,) and order.dtype == torch.int32
    assert sinks is None or sinks.shape == (hq,), "sinks: one logit per query head"
    sink_ptr = rows if sinks is None else sinks
    _decode_stage1[(hkv, bs, num_splits)](
        q, k_cache, v_cache, page_table, rows, seq_lens, rows if order is None else order,
        part_out, part_lse, out, sink_ptr,
        scale * _LOG2E * kv_scales[0], kv_scales[1], num_splits, window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), page_table.stride(0),
        part_out.stride(0), part_out.stride(1), part_out.stride(2) if num_splits > 1 else 0,
        part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=dim,
        BLOCK_D=block_d, BLOCK_N=block_n, DIRECT=num_splits == 1, DOT_PREC=dot_prec,
        HAS_ORDER=order is not None, HAS_SINKS=sinks is not None, num_warps=num_warps,
        num_stages=num_stages, **launch,
    )
    if num_splits > 1:
        _decode_stage2[(bs, hq)](
            part_out, part_lse, seq_lens, out, sink_ptr, num_splits, window,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
            HEAD_DIM=dim, BLOCK_D=block_d, BLOCK_N=block_n,
            SPLITS_PAD=triton.next_power_of_2(num_splits), num_warps=4 if block_d >= 128 else 2,
            HAS_SINKS=sinks is not None, **launch,
        )
    return out
