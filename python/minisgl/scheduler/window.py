"""The sliding-window layers' own KV pages, freed once they fall behind every future query's window.

When the engine gives the sliding layers a slot space of their own (``--sliding-pool-ratio``), each
request has a second page-table row for them (this group's ``PageSpace``). Its pages are allocated
together with the full-attention layers' (the same positions, so the same counts), but a page whose
positions all lie before ``q - window + 1`` for the lowest position ``q`` any later forward of the
request computes is never read again, and goes back to the free list::

    positions   0 ......... start ......... keep .................. alloc_len
                | freed     | held, unread  | held: inside the window |
                            '-- freed now --'   keep = page floor of (device_len - window + 1)

``start`` (per page-table row, page-aligned) is where the held pages begin. A freed page may be
handed to another request at once: a forward already launched that still reads it runs before
any forward that writes it (one stream), so the reuse is safe under overlap scheduling.

With a radix cache (``tree``, ``kvcache/window_radix.py``) a request that resumes from a hit
at ``n`` points its row at the tree's pages of ``[page_floor(n - window + 1), n)``: positions
before ``shared`` (per row) are the tree's and never freed here. A finishing request offers the
tree its pages before its last page boundary, so ``keep`` is counted from that boundary
(``page_floor(device_len)``), not from ``device_len``: at most one page more per request, and
what it offers is always enough to resume exactly where its cached prefix ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.core import Feed, Req
from minisgl.kvcache import BasePrefixCache, MatchResult
from minisgl.kvcache.window_radix import WindowRadixCache

from .group import CacheGroup
from .pages import PageSpace

if TYPE_CHECKING:
    from minisgl.engine import Engine


class SlidingWindowManager(CacheGroup):
    """``tree``: the radix cache that also keeps sliding pages (None: no prefix sharing);
    ``resumable``: a finishing request's offer to it must cover the window (any radix cache)."""

    def __init__(self, num_pages: int, page_size: int, window: int, page_table: torch.Tensor,
                 tree: WindowRadixCache | None = None, resumable: bool = False) -> None:
        self.pages = PageSpace(num_pages, page_size, page_table)
        self.page_size, self.window, self.tree = page_size, window, tree
        self.resumable = resumable or tree is not None
        rows = page_table.shape[0]
        self.start = [0] * rows  # per row: the first position still held
        self.shared = [0] * rows  # per row: positions before it are the tree's

    @classmethod
    def create(cls, engine: Engine, prefix_cache: BasePrefixCache,
               page_size: int) -> SlidingWindowManager | None:
        window, table = engine.cache_spec.max_window, engine.window_page_table
        if not engine.window_pages or window is None or table is None:
            return None
        tree = prefix_cache if prefix_cache.shares_prefixes else None
        if tree is not None and not isinstance(tree, WindowRadixCache):
            raise ValueError("a sliding-window pool frees pages a prefix hit would need: use "
                             "the naive prefix cache, or a WindowRadixCache, with it")
        return cls(engine.window_pages, page_size, window, table, tree)

    @property
    def free_tokens(self) -> int:
        self._reclaim()
        return self.pages.free_tokens

    @property
    def num_tokens(self) -> int:
        return self.pages.num_tokens

    def available(self) -> int:
        return self.free_tokens + (self.tree.window_evictable_size if self.tree else 0)

    def keep_from(self, device_len: int) -> int:
        """The first position whose page a request at ``device_len`` still needs."""
        if self.resumable:
            device_len -= device_len % self.page_size
        return max(0, device_len - self.window + 1) // self.page_size * self.page_size

    def trim(self, reqs: list[Req]) -> None:
        """Free the pages of ``reqs`` that their next forwards (queries from ``device_len`` on)
        can no longer see."""
        for req in reqs:
            row = req.table_idx
            keep = self.keep_from(req.device_len)
            if keep > self.start[row]:
                first = max(self.start[row], self.shared[row])
                if keep > first:
                    self.pages.put(self.pages.host_table[row, first: keep: self.page_size])
                self.start[row] = keep

    def match(self, req: Req, result: MatchResult) -> None:
        """``req`` resumes from a cached prefix of ``n`` tokens whose sliding slots the tree
        holds (-1 where freed): its row points at the ones its next queries read."""
        if self.tree is None or not result.handle.cached_len:
            return
        slots = self.tree.window_slots(result.handle)
        row, n = req.table_idx, len(slots)
        keep = self.keep_from(n)
        assert bool((slots[keep:] >= 0).all()), "a hit resumes where sliding KV was freed"
        self.pages.write(torch.full((n - keep,), row), torch.arange(keep, n), slots[keep:])
        self.start[row], self.shared[row] = keep, n

    def allocate(self, rows: list[int], starts: list[int], counts: list[int]) -> None:
        short = sum(counts) - self.free_tokens
        if short > 0 and self.tree is not None:  # drop cached sliding pages to make room
            self.pages.put(self.tree.evict_window(short))
        if sum(counts) > self.pages.free_tokens:
            raise RuntimeError(f"out of sliding-window KV pages: need {sum(counts)} tokens, "
                               f"have {self.pages.free_tokens}")
        self.pages.fill(rows, starts, counts)

    def owned(self, req: Req, alloc_len: int) -> tuple[int, torch.Tensor]:
        """The first position of the pages ``req`` owns, and their slots up to ``alloc_len``."""
        row = req.table_idx
        first = max(self.start[row], self.shared[row])
        return first, self.pages.host_table[row, first: max(first, alloc_len)].clone()

    def commit(self, req: Req, keep: int, end: int, feed: Feed) -> None:
        first, owned = self.owned(req, end)
        self.pages.put(owned[max(0, keep - first):])

    def release(self, req: Req, alloc_len: int, aligned: int) -> None:
        """The pages ``req`` owns before ``aligned`` go to the tree (those it lacks), the rest
        back to the free pages."""
        first, owned = self.owned(req, alloc_len)
        if self.tree is not None and aligned > first:
            offered = torch.full((aligned,), -1, dtype=torch.int32)
            offered[first:] = owned[: aligned - first]
            self.pages.put(self.tree.insert_window(req.cache_ids(aligned), offered))
            owned = owned[aligned - first:]
        self.pages.put(owned)
        self.start[req.table_idx] = self.shared[req.table_idx] = 0

    def flush(self) -> None:
        self.pages.flush()

    def check_integrity(self, live: list[tuple[Req, int]], thorough: bool = True) -> None:
        """free + held by live requests + the tree's == total, no page twice (``thorough`` only:
        the tree's pages are counted through a sort of its slots)."""
        self._reclaim()
        if not thorough:
            return
        held = [self.pages.pages(req.table_idx, max(self.start[req.table_idx],
                                                    self.shared[req.table_idx]), alloc_len)
                for req, alloc_len in live]
        if self.tree is not None:
            cached = self.tree.held_window_slots()
            if len(cached):
                held.append(torch.unique(cached // self.page_size))
        self.pages.check_integrity(held, name="sliding-window KV")

    def _reclaim(self) -> None:
        """The sliding pages of prefixes the tree evicted (for the full layers' pages)."""
        if self.tree is not None:
            self.pages.put(self.tree.take_freed_window())
