"""A hybrid model's recurrent-state slots, as a cache group: the state of a request lives in the
slot of its page-table row (``kvcache/state_pool.py``); the prefix cache keeps snapshots of it at
chosen lengths (``kvcache/hybrid_radix.py``), a hit resumes from one, and a verify feed's
positions leave their states in a draft group of slots (``Feed.draft_slot``).

A commit queues the copy of the kept position's state into the request's slot; the copies of a
step go in one batched copy (``_settle``) before anything reads a slot: the next forward, or a
snapshot taken when the request releases or shares its prefix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.core import Feed, Req
from minisgl.kvcache import BasePrefixCache, MatchResult, StatePool

from .group import CacheGroup

if TYPE_CHECKING:
    from minisgl.engine import Engine


class RecurrentStateManager(CacheGroup):
    def __init__(self, pool: StatePool, prefix_cache: BasePrefixCache) -> None:
        self.pool, self.prefix_cache = pool, prefix_cache
        self._moves: list[tuple[int, int]] = []  # (request slot, draft slot) of this step

    @classmethod
    def create(cls, engine: Engine, prefix_cache: BasePrefixCache,
               page_size: int) -> RecurrentStateManager | None:
        pool = engine.state_pool
        return cls(pool, prefix_cache) if pool is not None else None

    @property
    def draft_groups(self) -> int:
        return self.pool.num_draft_groups

    def match(self, req: Req, result: MatchResult) -> None:
        if result.handle.cached_len:  # the linear layers resume from the snapshot at the end
            self.prefix_cache.restore_state(result.handle, req.table_idx)

    def draft_slot(self, group: int) -> int:
        return self.pool.draft_slot(group)

    def before_chunk(self, req: Req) -> None:
        """The chunk that ended at ``req.snapshot_at`` is launched: keep the state there."""
        if req.snapshot_at and req.device_len == req.snapshot_at:
            self.prefix_cache.save_state(req.cache_ids(req.device_len), req.table_idx)
            req.snapshot_at = 0

    def commit(self, req: Req, keep: int, end: int, feed: Feed) -> None:
        if feed.draft_slot >= 0:  # the state after position device_len - 1
            self._moves.append((req.table_idx,
                                feed.draft_slot + req.device_len - 1 - feed.cached_len))

    def release(self, req: Req, alloc_len: int, aligned: int) -> None:
        self._settle()
        if aligned == req.device_len:  # the state after exactly the cached tokens
            self.prefix_cache.save_state(req.cache_ids(aligned), req.table_idx)

    def cache_prefix(self, req: Req, done: int) -> None:
        self._settle()
        if done == req.device_len:
            self.prefix_cache.save_state(req.cache_ids(done), req.table_idx)

    def flush(self) -> None:
        self._settle()

    def _settle(self) -> None:
        if self._moves:
            self.pool.copy_slots(*map(list, zip(*self._moves)))
            self._moves.clear()
