"""Whole pages of one slot space (``slot = page * page_size + offset``) handed to the rows of one
page table: the free pages, the table, and how far each row is allocated.

The host keeps the truth (``host_table``); changes reach the device table in one batched,
non-blocking copy per step (``flush``). Reading or writing the device table per request would make
the host wait for the device, which overlap scheduling must never do. Page 0 is the engine's
scratch page (padding rows write there): never handed out. Every cache group that stores K/V
(``full_attention.py``, ``window.py``) keeps its pages in one of these.
"""

from __future__ import annotations

import torch

from .free_pages import FreePages

_FEW = 64  # slots an allocation writes from Python lists (more: vectorised tensor ops)


def round_up(n: int, page: int) -> int:
    return -(-n // page) * page


class PageSpace:
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor) -> None:
        self.num_pages, self.page_size, self.page_table = num_pages, page_size, page_table
        on_host = page_table.device.type == "cpu"
        self.host_table = page_table if on_host else torch.zeros_like(page_table, device="cpu")
        self._dirty: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows, cols) not yet on device
        self.free = FreePages(torch.arange(1, num_pages, dtype=torch.int32))
        self.alloc = [0] * page_table.shape[0]  # per row: positions allocated (whole pages)

    @property
    def num_tokens(self) -> int:
        """Tokens the requests can use (the scratch page excluded)."""
        return (self.num_pages - 1) * self.page_size

    @property
    def free_tokens(self) -> int:
        return len(self.free) * self.page_size

    def fill(self, rows: list[int], starts: list[int], counts: list[int]) -> None:
        """Pages for positions ``[start, start + count)`` of each row (counts in whole pages; take
        ``free_tokens`` into account first), with a handful of tensor ops."""
        total = sum(counts)
        pages = self.free.take(total // self.page_size)
        for row, start, count in zip(rows, starts, counts):
            self.alloc[row] = start + count
        if total <= _FEW:  # a small decode or verify step: plain lists cost less than tensor ops
            size, r, c = self.page_size, [], []
            for row, start, count in zip(rows, starts, counts):
                r += [row] * count
                c += range(start, start + count)
            slots = pages.tolist() if size == 1 else [
                p * size + i for p in pages.tolist() for i in range(size)]
            self.write(torch.tensor(r), torch.tensor(c), torch.tensor(slots, dtype=torch.int32))
            return
        slots = (pages[:, None] * self.page_size + torch.arange(self.page_size, dtype=torch.int32))
        if counts.count(counts[0]) == len(counts):  # decode: as many slots for everyone
            run = torch.arange(counts[0])
            cols = (torch.tensor(starts)[:, None] + run).flatten()
            row_ids = torch.tensor(rows)[:, None].expand(-1, counts[0]).flatten()
        else:
            n = torch.tensor(counts)
            first = torch.cumsum(n, 0) - n  # where each request's run starts in ``slots``
            offset = torch.arange(total) - first.repeat_interleave(n)
            cols = torch.tensor(starts).repeat_interleave(n) + offset
            row_ids = torch.tensor(rows).repeat_interleave(n)
        self.write(row_ids, cols, slots.flatten())

    def write(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        self.host_table[rows, cols] = slots
        if self.host_table is not self.page_table:
            self._dirty.append((rows, cols))

    def put(self, slots: torch.Tensor) -> None:
        """Slots of whole pages (any of each page's slots) back to the free pages."""
        if len(slots):
            # NOTE: a copy, never a view: ``slots`` may be a view of the table, whose entries the
            # next allocation overwrites (with page size 1 the slots are the pages)
            pages = (torch.unique(slots.to(torch.int32) // self.page_size) if self.page_size > 1
                     else slots.to(torch.int32, copy=True))
            self.free.put(pages)

    def pages(self, row: int, start: int, end: int) -> torch.Tensor:
        """The pages of ``row``'s positions ``start .. end - 1`` (page-aligned)."""
        return self.host_table[row, start : end : self.page_size] // self.page_size

    def flush(self, new: list[tuple[int, int]] | None = None) -> list[int] | None:
        """Copy the changes since the last flush to the device. ``new``: (row, position) entries
        that a decode CUDA graph writes itself (``engine/graph.py``): left out, and their slots
        returned (host list)."""
        slots = None
        dirty, self._dirty = self._dirty, []
        if dirty:
            rows = torch.cat([r for r, _ in dirty]).to(torch.int32)
            cols = torch.cat([c for _, c in dirty]).to(torch.int32)
        else:
            rows = cols = torch.zeros(0, dtype=torch.int32)
        if new is not None:
            slots = self.host_table[[r for r, _ in new], [c for _, c in new]].tolist()
            if len(rows) <= _FEW:  # a decode step's own slots alone, most often: set lookups
                new_set = set(new)
                keep = [key not in new_set for key in zip(rows.tolist(), cols.tolist())]
                if not all(keep):
                    rows, cols = rows[keep], cols[keep]
            else:
                width = self.host_table.shape[1]
                new_rows = torch.tensor([r for r, _ in new], dtype=torch.int32)
                new_cols = torch.tensor([c for _, c in new], dtype=torch.int32)
                keep = ~torch.isin(rows * width + cols, new_rows * width + new_cols)
                rows, cols = rows[keep], cols[keep]
        if not len(rows):
            return slots
        from minisgl.kernel.triton.scatter import scatter_2d_  # on a GPU only: needs triton

        # rows, columns and slots in one copy, written by one kernel
        host = torch.stack([rows, cols, self.host_table[rows, cols]])
        if self.page_table.is_cuda:
            host = host.pin_memory()
        scatter_2d_(self.page_table, host.to(self.page_table.device, non_blocking=True))
        return slots

    def check_integrity(self, held: list[torch.Tensor], cached_tokens: int = 0,
                        name: str = "KV", thorough: bool = True) -> None:
        """free + ``held`` pages + ``cached_tokens`` == total, and (``thorough``: a sort of every
        page, a fraction of a second for a large pool) no page in two places."""
        held_pages = torch.cat(held).to(torch.int32) if held else torch.empty(0, dtype=torch.int32)
        total = (len(self.free) + len(held_pages)) * self.page_size + cached_tokens
        assert total == self.num_tokens, \
            f"{name} slots leaked: {total} accounted of {self.num_tokens}"
        if not thorough:
            return
        everything = torch.cat([self.free.all(), held_pages])
        assert len(torch.unique(everything)) == len(everything), f"a {name} page is owned twice"
