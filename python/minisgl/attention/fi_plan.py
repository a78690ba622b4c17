"""FlashInfer's paged-KV layout of a batch, built from minisgl's page table in plain torch.

minisgl's page table holds one slot per token position; FlashInfer reads K/V by whole pages, a
request's pages listed back to back::

    page table, row r :  slot(0) slot(1) ... slot(n-1)            slot = page * P + offset
    qo_indptr  [B+1]  :  where each request's new tokens start in q       (Triton's cu_seqlens)
    kv_indptr  [B+1]  :  where each request's pages start in kv_indices
    kv_indices [sum]  :  slot(j * P) // P for j < ceil(n / P), request after request
    last_page_len [B] :  tokens in each request's last page, 1 .. P

This relies on position ``j`` of a request sitting at offset ``j % P`` of its page, which whole-page
allocation and page-aligned prefix matches guarantee (the Triton kernels read slot by slot and do
not need it).

The host knows every length, so the indptrs and last-page lengths are host lists; the page ids
live in the device page table and are gathered there, in a launch whose size the host knows (no
synchronisation). Nothing here imports flashinfer: ``fi_backend.py`` hands these to its wrappers,
and the CPU tests check them against the Triton backend's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from minisgl.utils.transfer import to_device

__all__ = ["PagedLayout", "gather_page_ids", "paged_layout", "write_pending_slots"]


@dataclass(frozen=True)
class PagedLayout:
    """One batch's requests as FlashInfer's wrappers take them (host lists, module docstring)."""

    rows: list[int]  # page-table row of each request
    qo_indptr: list[int]  # [B+1]
    kv_indptr: list[int]  # [B+1]
    last_page_len: list[int]  # [B]

    @property
    def size(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        """Rows of q the layout covers (a prefill may carry padding rows after them)."""
        return self.qo_indptr[-1]

    @property
    def num_pages(self) -> int:
        return self.kv_indptr[-1]

    def host_tensors(self, pin: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """qo_indptr, kv_indptr, last_page_len as int32 CPU tensors (views of one buffer): what
        ``plan`` reads on the host and copies to the device itself."""
        flat = torch.tensor(self.qo_indptr + self.kv_indptr + self.last_page_len,
                            dtype=torch.int32, pin_memory=pin)
        b = self.size
        return flat[: b + 1], flat[b + 1 : 2 * b + 2], flat[2 * b + 2 :]


def paged_layout(feeds: Sequence, page_size: int, pad_to: int = 0,
                 dummy_row: int = -1) -> PagedLayout:
    """The layout of ``feeds`` (anything with ``table_idx``, ``cached_len``, ``device_len``): each
    attends over its context ``[0, device_len)`` with its new tokens ``[cached_len,
    device_len)``. ``pad_to``: append the dummy request (``dummy_row``, one token in one page,
    page 0) up to that many requests, as a padded CUDA-graph batch does."""
    rows, qo, kv, last = [], [0], [0], []
    for f in feeds:
        n = f.device_len
        pages = -(-n // page_size)
        rows.append(f.table_idx)
        qo.append(qo[-1] + f.device_len - f.cached_len)
        kv.append(kv[-1] + pages)
        last.append(n - (pages - 1) * page_size)
    for _ in range(len(rows), pad_to):
        rows.append(dummy_row)
        qo.append(qo[-1] + 1)
        kv.append(kv[-1] + 1)
        last.append(1)
    return PagedLayout(rows, qo, kv, last)


def gather_page_ids(table: torch.Tensor, layout: PagedLayout, page_size: int) -> torch.Tensor:
    """``kv_indices`` (int32, on ``table``'s device): the page of every request's ``j``-th page
    of context, read from the slot of its first position (any slot of a page gives its id)."""
    device = table.device
    pages = [b - a for a, b in zip(layout.kv_indptr, layout.kv_indptr[1:])]
    rows, counts, starts = to_device([layout.rows, pages, layout.kv_indptr[:-1]], torch.int64,
                                     device)
    total = layout.num_pages
    req = torch.repeat_interleave(torch.arange(layout.size, device=device), counts,
                                  output_size=total)  # the request of each entry
    first = (torch.arange(total, device=device) - starts[req]) * page_size
    return torch.div(table[rows[req], first], page_size, rounding_mode="floor").to(torch.int32)


def write_pending_slots(table: torch.Tensor, feeds: Sequence, slots: list[int] | None) -> None:
    """Write into ``table`` the new tokens' slots that a decode CUDA graph writes itself
    (``engine/graph.py``; ``slots`` from the scheduler's flush, ``-1``: already there), so that
    the page ids gathered before the replay include each request's newest page."""
    if slots is None:
        return
    todo = [(f.table_idx, f.device_len - 1, s) for f, s in zip(feeds, slots) if s >= 0]
    if not todo:
        return
    rows, cols, values = to_device([list(c) for c in zip(*todo)], torch.int64, table.device)
    table[rows, cols] = values.to(table.dtype)
