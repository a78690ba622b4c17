"""The full-attention layers' pages (every model has them) and the prefix cache that shares them.

A request's row of the page table maps its positions to KV slots::

    position  0 ............ handle.cached_len ............ device_len .. alloc_len
              | shared with the prefix cache | owned by the request (whole pages) |

``alloc_len`` (``PageSpace.alloc``) is what was allocated, in whole pages: ``device_len`` rounded
up, or more while a verify feed's drafts are in flight; it is the coordinator's count of a row's
positions. Pages are never shared partially. On release the request offers its computed prefix
to the prefix cache, which keeps what it does not already hold; everything else returns to the
free pages. When pages run short, unreferenced cached prefixes are evicted.
"""

from __future__ import annotations

import torch

from minisgl.core import Feed, Req
from minisgl.kvcache import BasePrefixCache, MatchResult

from .group import CacheGroup
from .pages import PageSpace


class FullAttentionManager(CacheGroup):
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor,
                 prefix_cache: BasePrefixCache) -> None:
        self.pages = PageSpace(num_pages, page_size, page_table)
        self.page_size, self.prefix_cache = page_size, prefix_cache

    def available(self) -> int:
        return self.pages.free_tokens + self.prefix_cache.evictable_size

    def match(self, req: Req, result: MatchResult) -> None:
        n = result.handle.cached_len
        self.pages.alloc[req.table_idx] = -(-n // self.page_size) * self.page_size
        if n:
            self.pages.write(torch.full((n,), req.table_idx), torch.arange(n), result.indices)

    def allocate(self, rows: list[int], starts: list[int], counts: list[int]) -> None:
        short = sum(counts) - self.pages.free_tokens
        if short > 0:
            self.evict(short)
        self.pages.fill(rows, starts, counts)

    def evict(self, tokens: int) -> None:
        """Evict unreferenced cached prefixes until ``tokens`` more are free."""
        self.pages.put(self.prefix_cache.evict(tokens))

    def commit(self, req: Req, keep: int, end: int, feed: Feed) -> None:
        self.commit_many([(req, keep, end, feed)])

    def commit_many(self, commits: list[tuple[Req, int, int, Feed]]) -> None:
        """The slots past each ``keep`` gathered in one indexing (a copy) and freed at once.
        NOTE: the device table keeps stale entries past ``keep``, which no forward reads before
        an allocation rewrites them."""
        rows: list[int] = []
        cols: list[int] = []
        for req, keep, end, _ in commits:
            if end > keep:
                rows += [req.table_idx] * (end - keep)
                cols += range(keep, end)
                self.pages.alloc[req.table_idx] = keep
        if rows:
            self.pages.put(self.pages.host_table[torch.tensor(rows), torch.tensor(cols)])

    def release(self, req: Req, alloc_len: int, aligned: int) -> None:
        slots = self.pages.host_table[req.table_idx, :alloc_len].clone()
        self.pages.put(self.prefix_cache.insert_prefix(req.cache_ids(aligned), slots[:aligned]))
        self.pages.put(slots[aligned:])
        self.pages.alloc[req.table_idx] = 0

    def cache_prefix(self, req: Req, done: int) -> None:
        """The prefix goes into the prefix cache and the request holds it through a new handle;
        where the cache already had those tokens (another request computed them meanwhile), the
        request's row is pointed at the cache's pages and its own copies are freed."""
        ids = req.cache_ids(done)
        duplicates = self.prefix_cache.insert_prefix(
            ids, self.pages.host_table[req.table_idx, :done].clone())
        result = self.prefix_cache.match_prefix(ids)
        self.prefix_cache.lock_handle(result.handle)
        if req.cache_handle is not None:
            self.prefix_cache.lock_handle(req.cache_handle, unlock=True)
        req.cache_handle = result.handle
        if len(duplicates):
            n = result.handle.cached_len
            self.pages.write(torch.full((n,), req.table_idx), torch.arange(n), result.indices)
            self.pages.put(duplicates)

    def check_integrity(self, live: list[tuple[Req, int]], thorough: bool = True) -> None:
        """free + cached + owned by live requests == total, and (``thorough``) the tree's own
        accounts and no page in two places."""
        if thorough:
            self.prefix_cache.check_integrity()
        owned = [self.pages.pages(req.table_idx, req.cache_handle.cached_len
                                  if req.cache_handle is not None else 0, alloc_len)
                 for req, alloc_len in live]
        cached = self.prefix_cache.evictable_size + self.prefix_cache.protected_size
        self.pages.check_integrity(owned, cached, thorough=thorough)
