"""The sliding-window layers' own KV pages, freed once they fall behind every future query's window.

When the engine gives the sliding layers a slot space of their own (``--sliding-pool-ratio``),
each request has a second page-table row for them. Its pages are allocated together with the
full-attention layers' (the same positions, so the same counts), but a page whose positions all
lie before ``q - window + 1`` for the lowest position ``q`` any later forward of the request
computes is never read again, and goes back to the free list::

    positions   0 ......... start ......... keep .................. alloc_len
                | freed     | held, unread  | held: inside the window |
                            '-- freed now --'   keep = page floor of (device_len - window + 1)

``start`` (per page-table row, page-aligned) is where the held pages begin. A freed page may be
handed to another request at once: a forward already launched that still reads it runs before
any forward that writes it (one stream), so the reuse is safe under overlap scheduling.

With a radix cache (``resumable``, ``kvcache/window_radix.py``) a request that resumes from a hit
at ``n`` points its row at the tree's pages of ``[page_floor(n - window + 1), n)``: positions
before ``shared`` (per row) are the tree's and never freed here. A finishing request offers the
tree its pages before its last page boundary, so ``keep`` is counted from that boundary
(``page_floor(device_len)``), not from ``device_len``: at most one page more per request, and
what it offers is always enough to resume exactly where its cached prefix ends.
"""

from __future__ import annotations

import torch

from minisgl.core import Req


class WindowPages:
    def __init__(self, num_pages: int, page_size: int, window: int,
                 page_table: torch.Tensor, resumable: bool = False) -> None:
        self.num_pages, self.page_size, self.window = num_pages, page_size, window
        self.resumable = resumable
        self.page_table = page_table
        on_host = page_table.device.type == "cpu"
        self.host_table = page_table if on_host else torch.zeros_like(page_table, device="cpu")
        self.dirty: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.free_pages = torch.arange(1, num_pages, dtype=torch.int32)  # page 0: scratch
        self.start = [0] * page_table.shape[0]  # per row: the first position still held
        self.shared = [0] * page_table.shape[0]  # per row: positions before it are the tree's

    @property
    def free_tokens(self) -> int:
        return len(self.free_pages) * self.page_size

    @property
    def num_tokens(self) -> int:
        return (self.num_pages - 1) * self.page_size

    def allocate(self, rows: list[int], starts: list[int], counts: list[int]) -> None:
        """Pages for positions ``[start, start + count)`` of each row (whole pages)."""
        total = sum(counts)
        n = total // self.page_size
        if n > len(self.free_pages):
            raise RuntimeError(f"out of sliding-window KV pages: need {n}, "
                               f"have {len(self.free_pages)}")
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        slots = (pages[:, None] * self.page_size
                 + torch.arange(self.page_size, dtype=torch.int32)).flatten()
        counts_t = torch.tensor(counts)
        first = torch.cumsum(counts_t, 0) - counts_t
        cols = torch.tensor(starts).repeat_interleave(counts_t) + (
            torch.arange(total) - first.repeat_interleave(counts_t))
        self._write(torch.tensor(rows).repeat_interleave(counts_t), cols, slots)

    def keep_from(self, device_len: int) -> int:
        """The first position whose page a request at ``device_len`` still needs."""
        if self.resumable:
            device_len -= device_len % self.page_size
        return max(0, device_len - self.window + 1) // self.page_size * self.page_size

    def trim(self, reqs: list[Req]) -> None:
        """Free the pages of ``reqs`` that their next forwards (queries from ``device_len`` on)
        can no longer see."""
        freed = []
        for req in reqs:
            row = req.table_idx
            keep = self.keep_from(req.device_len)
            if keep > self.start[row]:
                first = max(self.start[row], self.shared[row])
                if keep > first:
                    freed.append(self.host_table[row, first: keep: self.page_size])
                self.start[row] = keep
        if freed:
            self.free(torch.cat(freed))

    def adopt(self, req: Req, slots: torch.Tensor) -> None:
        """``req`` resumes from a cached prefix of ``len(slots)`` tokens whose sliding slots are
        ``slots`` (-1 where freed): its row points at the ones its next queries read."""
        row, n = req.table_idx, len(slots)
        keep = self.keep_from(n)
        assert bool((slots[keep:] >= 0).all()), "a hit resumes where sliding KV was freed"
        self.host_table[row, keep:n] = slots[keep:]
        if self.host_table is not self.page_table:
            self.dirty.append((torch.full((n - keep,), row), torch.arange(keep, n)))
        self.start[row], self.shared[row] = keep, n

    def owned(self, req: Req, alloc_len: int) -> tuple[int, torch.Tensor]:
        """The first position of the pages ``req`` owns, and their slots up to ``alloc_len``."""
        row = req.table_idx
        first = max(self.start[row], self.shared[row])
        return first, self.host_table[row, first: max(first, alloc_len)].clone()

    def free(self, slots: torch.Tensor) -> None:
        """Slots of whole pages (any of each page's slots) back to the free list."""
        if len(slots):
            pages = torch.unique(slots.to(torch.int32) // self.page_size)
            self.free_pages = torch.cat([self.free_pages, pages])

    def release(self, req: Req, alloc_len: int) -> None:
        """All of a finished or retracted request's own pages go back."""
        if req.table_idx < 0:
            return
        self.free(self.owned(req, alloc_len)[1])
        self.forget(req)

    def forget(self, req: Req) -> None:
        """``req``'s row holds nothing any more."""
        self.start[req.table_idx] = self.shared[req.table_idx] = 0

    def _write(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        self.host_table[rows, cols] = slots
        if self.host_table is not self.page_table:
            self.dirty.append((rows, cols))

    def flush(self) -> None:
        """This step's new entries to the device table (one scatter)."""
        if not self.dirty:
            return
        rows = torch.cat([r for r, _ in self.dirty]).to(torch.int32)
        cols = torch.cat([c for _, c in self.dirty]).to(torch.int32)
        self.dirty.clear()
        from minisgl.kernel.triton.scatter import scatter_2d_  # on a GPU only: needs triton

        host = torch.stack([rows, cols, self.host_table[rows, cols]])
        if self.page_table.is_cuda:
            host = host.pin_memory()
        scatter_2d_(self.page_table, host.to(self.page_table.device, non_blocking=True))

    def check_integrity(self, live: list[tuple[Req, int]],
                        cached: torch.Tensor | None = None) -> None:
        """free + held by live requests (+ ``cached``: the tree's slots) == total, no page
        twice. ``live``: (request, alloc_len)."""
        held = [self.owned(r, n)[1][:: self.page_size] // self.page_size for r, n in live]
        if cached is not None and len(cached):
            held.append(torch.unique(cached // self.page_size))
        everything = torch.cat([self.free_pages, *[h.to(torch.int32) for h in held]])
        assert len(everything) == self.num_pages - 1, (
            f"sliding-window KV pages leaked: {len(everything)} of {self.num_pages - 1}")
        assert len(torch.unique(everything)) == len(everything), "a window page is owned twice"
