"""Token-to-expert alignment of the fused MoE (no host sync): count the (token, k) pairs per
expert, pad each expert's segment to ``BLOCK_M`` rows, and scatter the pair ids into their
expert's segment; three small kernels, or one for a small batch. ``expert_ids[b]`` names the
expert of row block ``b``; padding rows hold the sentinel ``T * K``. The order of pairs inside a
segment comes from atomics and is not fixed (a small batch's is the pairs' order); every row is
computed on its own and written to its pair's slot, so results do not depend on it. With ``pdl``
the kernels launch as a chain (``pdl.py``), each waiting before it reads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .pdl import wait_then_release


def padded_capacity(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows after padding, worst case: every non-empty expert wastes up to ``block_m - 1`` rows."""
    return triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m) * block_m


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    wait_then_release(USE_PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    tl.atomic_add(counts_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=mask)


@triton.jit
def _offsets_kernel(ids_ptr, counts_ptr, expert_ids_ptr, sorted_ptr, total_ptr, n_experts, n_pairs,
                    n_blocks, capacity, COUNT: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_B: tl.constexpr,
                    FILL: tl.constexpr, USE_PDL: tl.constexpr):
    """One program: padded segment starts (left in ``counts`` as the scatter cursors), the padded
    total, each row block's expert, and the sentinel fill of ``sorted``. With COUNT (small batches,
    i.e. decode) it also counts the pairs per expert itself and scatters them, in pair order
    (saving a memset and two launches)."""
    wait_then_release(USE_PDL)
    e = tl.arange(0, BLOCK_E)
    e_ok = e < n_experts
    if COUNT:
        cnt = tl.zeros([BLOCK_E], dtype=tl.int32)
        for p0 in range(0, n_pairs, BLOCK_P):
            p = p0 + tl.arange(0, BLOCK_P)
            ids = tl.load(ids_ptr + p, mask=p < n_pairs, other=-1)
            cnt += tl.sum((ids[:, None] == e[None, :]).to(tl.int32), 0)
    else:
        cnt = tl.load(counts_ptr + e, mask=e_ok, other=0)
    padded = (cnt + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    tl.store(counts_ptr + e, ends - padded, mask=e_ok)
    tl.store(total_ptr, tl.sum(padded, 0))
    for b0 in range(0, n_blocks, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        # a block's expert = how many segments end at or before the block's first row
        owned = (ends[None, :] <= (b * BLOCK_M)[:, None]) & e_ok[None, :]
        tl.store(expert_ids_ptr + b, tl.sum(owned.to(tl.int32), 1), mask=b < n_blocks)
    for i0 in range(0, capacity, FILL):
        i = i0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + i, tl.full([FILL], 0, tl.int32) + n_pairs, mask=i < capacity)
    if COUNT:
        # the fill above lands before the pairs below overwrite their slots: one program, and a
        # barrier orders its threads' global stores
        tl.debug_barrier()
        cursor = ends - padded  # each expert's next free row
        for p0 in range(0, n_pairs, BLOCK_P):
            p = p0 + tl.arange(0, BLOCK_P)
            ids = tl.load(ids_ptr + p, mask=p < n_pairs, other=-1)
            hit = (ids[:, None] == e[None, :]).to(tl.int32)  # [P, E]
            # a pair's row: its expert's cursor plus the pairs of that expert before it here
            before = tl.cumsum(hit, 0) - hit
            slot = tl.sum(hit * (cursor[None, :] + before), 1)
            tl.store(sorted_ptr + slot, p.to(tl.int32), mask=p < n_pairs)
            cursor += tl.sum(hit, 0)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, n, BLOCK: tl.constexpr,
                    USE_PDL: tl.constexpr):
    wait_then_release(USE_PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    slot = tl.atomic_add(cursor_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=mask)
    tl.store(sorted_ptr + slot, offs.to(tl.int32), mask=mask)


_INLINE_COUNT_PAIRS = 256  # up to here one program counts (a few loop steps) instead of atomics


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int, pdl: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (sorted pair ids [capacity] int32, expert of each row block [capacity / block_m] int32,
    padded total [1] int32). Pair id = token * K + k; padding rows hold ``T * K``."""
    ids = topk_ids.reshape(-1)
    n = ids.numel()
    cap = padded_capacity(n, num_experts, block_m)
    dev = topk_ids.device
    count_inline = n <= _INLINE_COUNT_PAIRS
    counts = (torch.empty if count_inline else torch.zeros)(
        num_experts, dtype=torch.int32, device=dev)
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(cap // block_m, dtype=torch.int32, device=dev)
    total = torch.empty(1, dtype=torch.int32, device=dev)
    grid = (triton.cdiv(n, 256),)
    launch = pdl_.launch_options(topk_ids, pdl)
    if not count_inline:
        _count_kernel[grid](ids, counts, n, BLOCK=256, **launch)
    _offsets_kernel[(1,)](ids, counts, expert_ids, sorted_ids, total, num_experts, n,
                          cap // block_m, cap, COUNT=count_inline, BLOCK_M=block_m,
                          BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_P=64, BLOCK_B=32,
                          FILL=1024, **launch)
    if not count_inline:
        _scatter_kernel[grid](ids, counts, sorted_ids, n, BLOCK=256, **launch)
    return sorted_ids, expert_ids, total
