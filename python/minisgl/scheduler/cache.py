"""KV slots of requests: free pages, the prefix cache, and the page table rows that point into them.

A request's row of the page table maps its positions to KV slots::

    position  0 ............ handle.cached_len ............ device_len .. alloc_len
              | shared with the prefix cache | owned by the request (whole pages) |

``alloc_len`` (kept per row) is what was allocated, in whole pages: ``device_len`` rounded up, or
more while a verify step's drafts are in flight. Pages are never shared partially. A verify step
read back is committed (``commit``): the pages past the kept tokens go back, and on a hybrid model
the state after the last kept token becomes the request's. On release the request offers its
computed prefix to the prefix cache, which keeps what it does not already hold; everything else
returns to the free list.

With a sliding-window pool (``window``, ``window.py``) the sliding layers' pages are allocated
alongside, in their own table, and freed as they fall behind the window; ``available_tokens`` is
what both pools can give. A radix cache then keeps the sliding pages a finished request still held
(``kvcache/window_radix.py``) and resumes a hit only where they cover the window.

The host keeps the truth (``host_table``); changes reach the device table in one batched,
non-blocking copy per step (``flush``). Reading or writing the device table per request would make
the host wait for the device, which overlap scheduling must never do.
"""

from __future__ import annotations

import torch

from minisgl.core import Feed, Req
from minisgl.engine.prompt_logprobs import prefix_limit
from minisgl.kvcache import BasePrefixCache, StatePool
from minisgl.kvcache.window_radix import WindowRadixCache

from .free_pages import FreePages
from .window import WindowPages

_FEW = 64  # slots an allocation writes from Python lists (more: vectorised tensor ops)


def _round_up(n: int, page: int) -> int:
    return -(-n // page) * page


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, prefix_cache: BasePrefixCache,
                 page_table: torch.Tensor, window: WindowPages | None = None,
                 state_pool: StatePool | None = None) -> None:
        if window is not None and prefix_cache.shares_prefixes and not (
                isinstance(prefix_cache, WindowRadixCache) and window.resumable):
            raise ValueError("a sliding-window pool frees pages a prefix hit would need: use "
                             "the naive prefix cache, or a WindowRadixCache, with it")
        self.num_pages, self.page_size, self.window = num_pages, page_size, window
        # the tree that also holds sliding pages (None: no prefix sharing or no sliding pool)
        self.window_tree = prefix_cache if window is not None and prefix_cache.shares_prefixes \
            else None
        self.prefix_cache, self.page_table = prefix_cache, page_table
        on_host = page_table.device.type == "cpu"
        self.host_table = page_table if on_host else torch.zeros_like(page_table, device="cpu")
        self._dirty: list[tuple[torch.Tensor, torch.Tensor]] = []  # (rows, cols) not yet on device
        # page 0 is the engine's scratch page (padding rows write there): never handed out
        self.free_pages = FreePages(torch.arange(1, num_pages, dtype=torch.int32))
        self.num_hit_tokens = 0  # tokens served from the prefix cache, over all matches
        self._alloc = [0] * page_table.shape[0]  # per page-table row: alloc_len
        self.state_pool = state_pool
        # (request slot, draft slot) state copies of committed verify steps, applied together
        # before anything reads a request's slot (``_settle``)
        self._moves: list[tuple[int, int]] = []

    @property
    def num_tokens(self) -> int:
        """Tokens the requests can use (the scratch page excluded)."""
        return (self.num_pages - 1) * self.page_size

    @property
    def available_tokens(self) -> int:
        """Tokens that can be allocated now, evicting unreferenced cached prefixes if needed."""
        n = len(self.free_pages) * self.page_size + self.prefix_cache.evictable_size
        if self.window is None:
            return n
        tree = self.window_tree.window_evictable_size if self.window_tree is not None else 0
        return min(n, self.window.free_tokens + tree)

    def alloc_len(self, req: Req) -> int:
        return self._alloc[req.table_idx]

    @property
    def draft_groups(self) -> int | None:
        """How many requests one step may verify: a hybrid model's draft groups of state slots
        (None: no limit)."""
        return self.state_pool.num_draft_groups if self.state_pool is not None else None

    def draft_slot(self, group: int) -> int:
        """The first state slot of draft group ``group`` (-1 without a state pool)."""
        return self.state_pool.draft_slot(group) if self.state_pool is not None else -1

    def tokens_needed(self, req: Req, new_device_len: int) -> int:
        return _round_up(new_device_len, self.page_size) - self.alloc_len(req)

    def tokens_for_one_more(self, reqs: list[Req]) -> int:
        """``tokens_needed(req, req.device_len + 1)`` summed over ``reqs`` (a decode step), without
        a call per request: a new page for each request whose pages are full."""
        alloc = self._alloc
        return self.page_size * sum(1 for req in reqs if alloc[req.table_idx] <= req.device_len)

    @property
    def shares_prefixes(self) -> bool:
        return self.prefix_cache.shares_prefixes

    def hit_len(self, req: Req) -> int:
        """How many tokens ``match`` would reuse now (nothing is locked)."""
        ids = req.input_ids[: prefix_limit(req)]
        return self.prefix_cache.match_resumable(ids).handle.cached_len

    def match(self, req: Req) -> None:
        """Reuse the longest cached prefix; at least one token is left to compute (its logits), and
        the tokens whose prompt log-probs are asked for are computed too."""
        result = self.prefix_cache.match_resumable(req.input_ids[: prefix_limit(req)])
        self.prefix_cache.lock_handle(result.handle)
        n = result.handle.cached_len
        if n:  # a hybrid model's linear layers resume from the state snapshot at the match's end
            self.prefix_cache.restore_state(result.handle, req.table_idx)
        self.num_hit_tokens += n
        if req.output_len == 0:
            req.cache_hit_len = n
        req.cache_handle, req.cached_len, req.device_len = result.handle, n, n
        self._alloc[req.table_idx] = _round_up(n, self.page_size)
        if n:
            self._write(torch.full((n,), req.table_idx), torch.arange(n), result.indices)
            if self.window_tree is not None:
                self.window.adopt(req, self.window_tree.window_slots(result.handle))
        branch = self.prefix_cache.branch_point(req.input_ids[: prefix_limit(req)])
        req.snapshot_at = branch if branch > n else 0

    def save_state_at_branch(self, req: Req) -> None:
        """The chunk that ended at ``req.snapshot_at`` is launched: keep the state there."""
        if req.snapshot_at and req.device_len == req.snapshot_at:
            self.prefix_cache.save_state(req.input_ids[: req.device_len], req.table_idx)
            req.snapshot_at = 0

    def trim(self, reqs: list[Req]) -> None:
        """Free the sliding-window pages ``reqs`` can no longer see (before counting what is
        available; ``allocate`` does it too)."""
        if self.window is not None:
            self.window.trim(reqs)

    def allocate(self, req: Req, new_device_len: int) -> None:
        """Give ``req`` the pages to hold ``new_device_len`` tokens. Check ``available_tokens``
        first."""
        self.allocate_many([req], [new_device_len])

    def allocate_many(self, reqs: list[Req], new_device_lens: list[int]) -> None:
        """``allocate`` for a whole batch with a handful of tensor ops (decode calls it every
        step)."""
        rows, starts, counts = [], [], []
        for req, new_len in zip(reqs, new_device_lens):
            start = self.alloc_len(req)
            count = _round_up(new_len, self.page_size) - start
            if count > 0:
                rows.append(req.table_idx)
                starts.append(start)
                counts.append(count)
                self._alloc[req.table_idx] = start + count
        if self.window is not None:
            self.window.trim(reqs)  # before allocating: the freed pages serve this step too
            if rows:
                self._window_room(sum(counts))
                self.window.allocate(rows, starts, counts)
        if not rows:
            return
        total = sum(counts)
        pages = self._take_pages(total // self.page_size)
        if total <= _FEW:  # a small decode or verify step: plain lists cost less than tensor ops
            size, r, c = self.page_size, [], []
            for row, start, count in zip(rows, starts, counts):
                r += [row] * count
                c += range(start, start + count)
            slots = pages.tolist() if size == 1 else [
                p * size + i for p in pages.tolist() for i in range(size)]
            self._write(torch.tensor(r), torch.tensor(c), torch.tensor(slots, dtype=torch.int32))
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
        self._write(row_ids, cols, slots.flatten())

    def _write(self, rows: torch.Tensor, cols: torch.Tensor, slots: torch.Tensor) -> None:
        self.host_table[rows, cols] = slots
        if self.host_table is not self.page_table:
            self._dirty.append((rows, cols))

    def flush(self, new_tokens_of: list[Req] | None = None) -> list[int] | None:
        """Copy this step's page-table changes to the device (before the batch is prepared).

        ``new_tokens_of``: a decode batch whose CUDA graph writes its new tokens' slots itself
        (``engine/graph.py``): those entries are left out, and their slots returned (host list).
        """
        self._settle()
        slots = None
        dirty, self._dirty = self._dirty, []
        if dirty:
            rows = torch.cat([r for r, _ in dirty]).to(torch.int32)
            cols = torch.cat([c for _, c in dirty]).to(torch.int32)
        else:
            rows = cols = torch.zeros(0, dtype=torch.int32)
        if new_tokens_of is not None:
            new = [(r.table_idx, r.device_len - 1) for r in new_tokens_of]
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
        if self.window is not None:
            self.window.flush()
        if not len(rows):
            return slots
        from minisgl.kernel.triton.scatter import scatter_2d_  # on a GPU only: needs triton

        # rows, columns and slots in one copy, written by one kernel
        host = torch.stack([rows, cols, self.host_table[rows, cols]])
        if self.page_table.is_cuda:
            host = host.pin_memory()
        scatter_2d_(self.page_table, host.to(self.page_table.device, non_blocking=True))
        return slots

    def flush_prefix_cache(self) -> int:
        """Evict every unreferenced cached prefix (all of them when no request runs): tokens
        freed."""
        n = self.prefix_cache.evictable_size
        if n:
            self._evict(n)
        return n

    def _window_room(self, tokens: int) -> None:
        """Drop cached sliding pages until ``tokens`` fit the sliding pool."""
        short = tokens - self.window.free_tokens
        if short > 0 and self.window_tree is not None:
            self.window.free(self.window_tree.evict_window(short))

    def _evict(self, tokens: int) -> None:
        self._free_slots(self.prefix_cache.evict(tokens))
        if self.window_tree is not None:  # the evicted nodes' sliding pages
            self.window.free(self.window_tree.take_freed_window())

    def _take_pages(self, n: int) -> torch.Tensor:
        short = n - len(self.free_pages)
        if short > 0:
            self._evict(short * self.page_size)
        return self.free_pages.take(n)

    def _free_slots(self, slots: torch.Tensor) -> None:
        if len(slots):
            pages = slots.to(torch.int32)  # with page size 1 the slots are the pages
            if self.page_size > 1:
                pages = torch.unique(pages // self.page_size)
            self.free_pages.put(pages)

    def release(self, req: Req) -> None:
        """Return a request's slots: its computed prefix goes to the prefix cache, the rest is
        freed."""
        self._settle()
        alloc_len = self.alloc_len(req)
        self._alloc[req.table_idx] = 0
        slots = self.host_table[req.table_idx, :alloc_len].clone()
        # every fed token's KV is computed, or being computed by a launched forward (stream order
        # makes it available to every later one)
        done = req.device_len
        aligned = done - done % self.page_size
        self._free_slots(self.prefix_cache.insert_prefix(req.input_ids[:aligned], slots[:aligned]))
        self._free_slots(slots[aligned:])
        if self.window_tree is not None and req.table_idx >= 0:
            self._offer_window(req, alloc_len, aligned)
        elif self.window is not None:
            self.window.release(req, alloc_len)
        if aligned == done and req.table_idx >= 0:  # the state after exactly the cached tokens
            self.prefix_cache.save_state(req.input_ids[:aligned], req.table_idx)
        if req.cache_handle is not None:
            self.prefix_cache.lock_handle(req.cache_handle, unlock=True)
        req.cache_handle = None

    def _offer_window(self, req: Req, alloc_len: int, aligned: int) -> None:
        """The sliding pages ``req`` owns before ``aligned`` go to the tree (those it lacks), the
        rest back to the sliding pool."""
        first, owned = self.window.owned(req, alloc_len)
        if aligned > first:
            offered = torch.full((aligned,), -1, dtype=torch.int32)
            offered[first:] = owned[: aligned - first]
            self.window.free(self.window_tree.insert_window(req.input_ids[:aligned], offered))
            owned = owned[aligned - first:]
        self.window.free(owned)
        self.window.forget(req)

    def cache_prefix(self, req: Req) -> None:
        """Share a running request's computed prefix now, not only when it finishes.

        The prefix goes into the prefix cache and the request holds it through a new handle; where
        the cache already had those tokens (another request computed them meanwhile), the request's
        row is pointed at the cache's pages and its own copies are freed.
        """
        # called when the forward that fed the prompt has been read back: all of it is computed
        self._settle()
        done = req.device_len - req.device_len % self.page_size
        old = req.cache_handle
        if not self.shares_prefixes or old is None or done <= old.cached_len:
            return
        ids = req.input_ids[:done]
        duplicates = self.prefix_cache.insert_prefix(
            ids, self.host_table[req.table_idx, :done].clone())
        if done == req.device_len:
            self.prefix_cache.save_state(ids, req.table_idx)
        result = self.prefix_cache.match_prefix(ids)
        self.prefix_cache.lock_handle(result.handle)
        self.prefix_cache.lock_handle(old, unlock=True)
        req.cache_handle = result.handle
        if len(duplicates):
            n = result.handle.cached_len
            self._write(torch.full((n,), req.table_idx), torch.arange(n), result.indices)
            self._free_slots(duplicates)

    def commit(self, req: Req, kept: int, feed: Feed) -> None:
        """``feed`` verified drafts and was read back: ``req`` keeps the KV of its first ``kept``
        positions (those of the tokens it kept, the last excepted: it was never fed). The whole
        pages past them go back (the device table keeps stale entries there, which no forward
        reads before an allocation rewrites them); on a hybrid model the state after position
        ``kept - 1``, left in the feed's draft slots, becomes the request's."""
        row = req.table_idx
        keep, end = _round_up(kept, self.page_size), self._alloc[row]
        if end > keep:
            self._free_slots(self.host_table[row, keep:end].clone())
            if self.window is not None:  # the sliding pages of those positions too
                first, owned = self.window.owned(req, end)
                self.window.free(owned[max(0, keep - first):])
            self._alloc[row] = keep
        req.cached_len = req.device_len = kept
        if feed.draft_slot >= 0:
            self._moves.append((row, feed.draft_slot + kept - 1 - feed.cached_len))

    def _settle(self) -> None:
        """The committed states, in one batched copy (before a forward or a snapshot reads a
        request's slot)."""
        if self._moves:
            self.state_pool.copy_slots(*map(list, zip(*self._moves)))
            self._moves.clear()

    def check_integrity(self, live_reqs: list[Req]) -> None:
        """free + cached + owned by live requests == total, and no page is in two places."""
        self.prefix_cache.check_integrity()
        owned = []
        for req in live_reqs:
            shared = req.cache_handle.cached_len if req.cache_handle is not None else 0
            row = self.host_table[req.table_idx, shared : self.alloc_len(req)]
            owned.append(row[:: self.page_size] // self.page_size)
        owned_pages = torch.cat(owned) if owned else torch.empty(0, dtype=torch.int32)
        cached = self.prefix_cache.evictable_size + self.prefix_cache.protected_size
        total = (len(self.free_pages) + len(owned_pages)) * self.page_size + cached
        assert total == self.num_tokens, f"KV slots leaked: {total} accounted of {self.num_tokens}"
        everything = torch.cat([self.free_pages.all(), owned_pages.to(torch.int32)])
        assert len(torch.unique(everything)) == len(everything), "a KV page is owned twice"
        if self.window is not None:
            cached = (self.window_tree.held_window_slots() if self.window_tree is not None
                      else None)
            self.window.check_integrity([(r, self.alloc_len(r)) for r in live_reqs], cached)
