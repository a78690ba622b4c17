"""The decode CUDA graph's own kernels: its first, which gathers the step's inputs, and its last,
which samples a plain greedy batch.

``gather_inputs``: from the step's rows, positions and new KV slots (copied from the host), the
input tokens (from the token pool, where the previous step's sampler wrote them) and the positions,
and the slots written into the page table (where the attention reads them), in one launch where
torch's indexing took two and the page-table update a copy and a kernel of its own; for a model
with M-RoPE also the rotary positions, each shifted by its request's delta. A slot of -1
is read from the page table instead (a caller that updated the table itself).

``greedy_to_pool``: the argmax of each row of the logits, written as the sampled token to ``out``
(int64) and to the token pool, where the next step reads its input. Outside the graph the same work
took five launches a step (torch's argmax, a cast, the index-put into the token pool), each a few
microseconds of a one-token step. The graph cannot know whether the next batch is plain greedy, so
the kernels read a flag from the step's inputs and return at once when it is 0 (the sampler then
runs after the graph, as for any other batch).
A row is split over ``splits`` programs (``_partial_kernel``); each lane keeps the first index of
its running maximum, so the smallest index among the lanes and splits that hold the maximum is the
first index of the row's maximum, as ``torch.argmax`` returns. ``_final_kernel`` merges the splits
(one split: the partial kernel writes the token itself).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .pdl import wait_then_release


# one variant for every batch size: the step's vectors are rows of the graph's flat input buffer
# (aligned for some sizes only), and a few lanes more or less cost nothing in a one-program kernel
@triton.jit(do_not_specialize=["bs"],
            do_not_specialize_on_alignment=["rows_ptr", "pos_ptr", "slots_ptr", "shift_ptr"])
def _gather_kernel(rows_ptr, pos_ptr, slots_ptr, shift_ptr, bs, pool_ptr, pool_stride, table_ptr,
                   table_stride, ids_ptr, pos_out_ptr, loc_ptr, rope_out_ptr,
                   HAS_SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < bs
    row = tl.load(rows_ptr + i, mask=ok, other=0).to(tl.int64)
    pos = tl.load(pos_ptr + i, mask=ok, other=0)
    slot = tl.load(slots_ptr + i, mask=ok, other=0)
    tl.store(ids_ptr + i, tl.load(pool_ptr + row * pool_stride + pos, mask=ok), mask=ok)
    tl.store(pos_out_ptr + i, pos.to(tl.int64), mask=ok)
    if HAS_SHIFT:
        shift = tl.load(shift_ptr + i, mask=ok, other=0)
        tl.store(rope_out_ptr + i, (pos + shift).to(tl.int64), mask=ok)
    entry = table_ptr + row * table_stride + pos
    given = slot >= 0
    tl.store(entry, slot, mask=ok & given)
    slot = tl.where(given, slot, tl.load(entry, mask=ok & ~given, other=0))
    tl.store(loc_ptr + i, slot, mask=ok)


_GATHER_BLOCK = 128  # requests per program (one compiled variant for every batch size)


def gather_inputs(rows: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                  token_pool: torch.Tensor, page_table: torch.Tensor,
                  shifts: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rows``, ``positions``, ``slots``: int32 [B], the requests' page-table rows and their new
    tokens' positions and KV slots (-1: already in the page table) -> (input tokens, positions
    int64, KV slots, rotary positions int64): ``token_pool[rows, positions]``, ``positions``,
    the slots, and ``positions + shifts`` (int32 [B], Qwen's M-RoPE deltas: a decode token's
    three positions are equal, ``multimodal/mrope.py``; None: the positions tensor itself);
    each given slot is written to ``page_table[rows, positions]``."""
    bs = rows.shape[0]
    assert token_pool.stride(1) == 1 and page_table.stride(1) == 1
    assert rows.dtype == positions.dtype == slots.dtype == page_table.dtype == torch.int32
    assert shifts is None or shifts.dtype == torch.int32
    ids = torch.empty(bs, dtype=token_pool.dtype, device=rows.device)
    pos = torch.empty(bs, dtype=torch.int64, device=rows.device)
    loc = torch.empty(bs, dtype=page_table.dtype, device=rows.device)
    rope = pos if shifts is None else torch.empty(bs, dtype=torch.int64, device=rows.device)
    _gather_kernel[(triton.cdiv(bs, _GATHER_BLOCK),)](
        rows, positions, slots, positions if shifts is None else shifts, bs, token_pool,
        token_pool.stride(0), page_table, page_table.stride(0), ids, pos, loc, rope,
        HAS_SHIFT=shifts is not None, BLOCK=_GATHER_BLOCK, num_warps=4)
    return ids, pos, loc, rope


@triton.jit
def _write(out_ptr, pool_ptr, rows_ptr, pos_ptr, pool_stride, r, token):
    tl.store(out_ptr + r, token.to(tl.int64))
    row = tl.load(rows_ptr + r).to(tl.int64)
    tl.store(pool_ptr + row * pool_stride + tl.load(pos_ptr + r), token.to(tl.int32))


@triton.jit(do_not_specialize_on_alignment=["flag_ptr", "rows_ptr", "pos_ptr"])
def _partial_kernel(logits_ptr, stride, V, chunk, flag_ptr, val_ptr, idx_ptr, out_ptr, pool_ptr,
                    rows_ptr, pos_ptr, pool_stride, SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                    USE_PDL: tl.constexpr):
    wait_then_release(USE_PDL)
    if tl.load(flag_ptr) == 0:
        return
    r, s = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    lo = s * chunk
    hi = tl.minimum(lo + chunk, V)
    for start in range(lo, hi, BLOCK):
        idx = start + cols
        x = tl.load(logits_ptr + r * stride + idx, mask=idx < hi, other=float("-inf"))
        better = x.to(tl.float32) > best  # strict: a lane keeps the first index of its maximum
        best_idx = tl.where(better, idx, best_idx)
        best = tl.where(better, x.to(tl.float32), best)
    top = tl.max(best, axis=0)
    # lanes that never saw more than -inf keep index 0, the answer of an all -inf row
    token = tl.min(tl.where(best == top, best_idx, V), axis=0)
    token = tl.where(top == float("-inf"), lo, token)
    if SPLITS == 1:
        _write(out_ptr, pool_ptr, rows_ptr, pos_ptr, pool_stride, r, token)
    else:
        tl.store(val_ptr + r * SPLITS + s, top)
        tl.store(idx_ptr + r * SPLITS + s, token)


@triton.jit(do_not_specialize_on_alignment=["flag_ptr", "rows_ptr", "pos_ptr"])
def _final_kernel(flag_ptr, val_ptr, idx_ptr, out_ptr, pool_ptr, rows_ptr, pos_ptr, pool_stride,
                  SPLITS: tl.constexpr, USE_PDL: tl.constexpr):
    wait_then_release(USE_PDL)
    if tl.load(flag_ptr) == 0:
        return
    r = tl.program_id(0)
    s = tl.arange(0, SPLITS)
    vals = tl.load(val_ptr + r * SPLITS + s)
    idxs = tl.load(idx_ptr + r * SPLITS + s)
    top = tl.max(vals, axis=0)
    token = tl.min(tl.where(vals == top, idxs, 2147483647), axis=0)
    _write(out_ptr, pool_ptr, rows_ptr, pos_ptr, pool_stride, r, token)


def pick_splits(rows: int) -> int:
    """Programs per row: 64 up to 16 rows, then fewer, 16 from 64 rows: a few rows need many
    programs each to fill the GPU, many rows fill it with few (docs/performance.md, "Tuned
    kernels")."""
    return max(16, min(64, 1024 // triton.next_power_of_2(rows)))


def greedy_to_pool(logits: torch.Tensor, flag: torch.Tensor, rows: torch.Tensor,
                   positions: torch.Tensor, token_pool: torch.Tensor, out: torch.Tensor,
                   splits: int | None = None, block: int = 1024, pdl: bool = False) -> None:
    """If ``flag[0]`` is not 0: ``out[i] = logits[i].argmax()`` and
    ``token_pool[rows[i], positions[i]] = out[i]`` for every row ``i`` of ``logits [B, V]``; else
    nothing. ``flag``/``rows``/``positions``: int32 or int64; ``token_pool``: int32 [R, L]
    (row-contiguous)."""
    b, v = logits.shape
    assert logits.stride(1) == 1 and token_pool.stride(1) == 1 and out.shape == (b,)
    assert token_pool.dtype == torch.int32 and out.dtype == torch.int64
    splits = pick_splits(b) if splits is None else splits
    assert splits & (splits - 1) == 0, "splits: a power of two"
    chunk = triton.cdiv(triton.cdiv(v, splits), block) * block
    vals = torch.empty((b, splits), dtype=torch.float32, device=logits.device)
    idxs = torch.empty((b, splits), dtype=torch.int32, device=logits.device)
    opts = pdl_.launch_options(logits, pdl)
    _partial_kernel[(b, splits)](logits, logits.stride(0), v, chunk, flag, vals, idxs, out,
                                 token_pool, rows, positions, token_pool.stride(0),
                                 SPLITS=splits, BLOCK=block, num_warps=4, **opts)
    if splits > 1:
        _final_kernel[(b,)](flag, vals, idxs, out, token_pool, rows, positions,
                            token_pool.stride(0), SPLITS=splits, num_warps=1, **opts)
