"""``table[rows[i], cols[i]] = values[i]`` from one int32 ``[3, n]`` device tensor: the page table's
per-step update (``scheduler/cache.py``), sent in one copy. torch's indexed write of the same took
three launches (its int32 indices are first cast to int64), about 5 us of a one-token step."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# n varies from step to step: one variant (no specialisation on n, one block size), compiled once
@triton.jit(do_not_specialize=["n"])
def _scatter_kernel(t_ptr, stride, u_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    row = tl.load(u_ptr + i, mask=ok, other=0).to(tl.int64)
    col = tl.load(u_ptr + n + i, mask=ok, other=0)
    tl.store(t_ptr + row * stride + col, tl.load(u_ptr + 2 * n + i, mask=ok), mask=ok)


def scatter_2d_(table: torch.Tensor, updates: torch.Tensor) -> None:
    """``updates``: int32 ``[3, n]`` (rows, columns, values) on ``table``'s device; ``table``: int32
    with contiguous rows. Repeated (row, column) pairs: any one of their values lands."""
    n = updates.shape[1]
    assert updates.shape[0] == 3 and updates.is_contiguous() and updates.dtype == table.dtype
    assert table.stride(1) == 1
    if n:
        _scatter_kernel[(triton.cdiv(n, 1024),)](table, table.stride(0), updates, n, BLOCK=1024,
                                                  num_warps=4)
