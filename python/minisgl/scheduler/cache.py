"""The scheduler's one interface to its caches: a coordinator over one manager per cache group
(``group.py``): the full-attention layers' pages and the prefix cache that shares them
(``full_attention.py``, always there), then whatever the model's cache spec adds (``GROUPS``: the
sliding-window layers' own pages, ``window.py``; a hybrid model's recurrent-state slots,
``state_slots.py``).

The coordinator owns a request's positions: a row is allocated to ``alloc_len`` positions in
whole pages, and every group is told the same positions at the same points of the request's life
(a prefix hit, each step's allocation, a verify feed's commit, the release). What can be
allocated is what the scarcest group can give. It calls every group alike: a new group is a file
and a line in ``GROUPS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.core import Feed, Req
from minisgl.engine.prompt_logprobs import prefix_limit
from minisgl.kvcache import BasePrefixCache, create_prefix_cache

from .full_attention import FullAttentionManager
from .group import CacheGroup
from .pages import round_up
from .state_slots import RecurrentStateManager
from .window import SlidingWindowManager

if TYPE_CHECKING:
    from minisgl.engine import Engine

# the groups a model may have besides full attention, created (or not) from its cache spec, in
# the order they are called
GROUPS: dict[str, type[CacheGroup]] = {
    "sliding_window": SlidingWindowManager,
    "recurrent_state": RecurrentStateManager,
}


def create_cache(engine: Engine, prefix_cache_name: str) -> CacheCoordinator:
    """The coordinator of ``engine``'s caches, with the prefix cache called
    ``prefix_cache_name``."""
    page_size = engine.config.page_size
    window = engine.cache_spec.max_window if engine.window_pages else None
    prefix_cache = create_prefix_cache(prefix_cache_name, page_size, engine.device,
                                       engine.state_pool, window)
    full = FullAttentionManager(engine.num_pages, page_size, engine.page_table, prefix_cache)
    groups = [group for cls in GROUPS.values()
              if (group := cls.create(engine, prefix_cache, page_size)) is not None]
    return CacheCoordinator(full, groups)


class CacheCoordinator:
    def __init__(self, full: FullAttentionManager, groups: list[CacheGroup] | None = None) -> None:
        self.full, self.groups = full, [full, *(groups or [])]
        self.prefix_cache: BasePrefixCache = full.prefix_cache
        self.page_size = full.page_size
        self.num_hit_tokens = 0  # tokens served from the prefix cache, over all matches
        # the group of each kind present (None: the model has none), for what reads it directly
        self.window = next((g for g in self.groups if isinstance(g, SlidingWindowManager)),
                           None)

    @property
    def num_tokens(self) -> int:
        """Tokens the requests can use (the scratch page excluded)."""
        return self.full.pages.num_tokens

    @property
    def free_tokens(self) -> int:
        """Free full-attention tokens, not counting what eviction would free."""
        return self.full.pages.free_tokens

    @property
    def available_tokens(self) -> int:
        """Tokens that can be allocated now, evicting unreferenced cached prefixes if needed."""
        return min(n for g in self.groups if (n := g.available()) is not None)

    @property
    def shares_prefixes(self) -> bool:
        return self.prefix_cache.shares_prefixes

    @property
    def draft_groups(self) -> int | None:
        """How many requests one step may verify (None: no limit)."""
        limits = [n for g in self.groups if (n := g.draft_groups) is not None]
        return min(limits) if limits else None

    def draft_slot(self, group: int) -> int:
        """Where verify feed ``group`` of a step leaves its per-position state (-1: nowhere)."""
        return max(g.draft_slot(group) for g in self.groups)

    def alloc_len(self, req: Req) -> int:
        return self.full.pages.alloc[req.table_idx]

    def tokens_needed(self, req: Req, new_device_len: int) -> int:
        return round_up(new_device_len, self.page_size) - self.alloc_len(req)

    def tokens_for_one_more(self, reqs: list[Req]) -> int:
        """``tokens_needed(req, req.device_len + 1)`` summed over ``reqs`` (a decode step), without
        a call per request: a new page for each request whose pages are full."""
        alloc = self.full.pages.alloc
        return self.page_size * sum(1 for req in reqs if alloc[req.table_idx] <= req.device_len)

    def hit_len(self, req: Req) -> int:
        """How many tokens ``match`` would reuse now (nothing is locked)."""
        ids = req.cache_ids(prefix_limit(req))
        return self.prefix_cache.match_resumable(ids).handle.cached_len

    def match(self, req: Req) -> None:
        """Reuse the longest cached prefix; at least one token is left to compute (its logits), and
        the tokens whose prompt log-probs are asked for are computed too."""
        ids = req.cache_ids(prefix_limit(req))
        result = self.prefix_cache.match_resumable(ids)
        self.prefix_cache.lock_handle(result.handle)
        n = result.handle.cached_len
        self.num_hit_tokens += n
        if req.output_len == 0:
            req.cache_hit_len = n
        req.cache_handle, req.cached_len, req.device_len = result.handle, n, n
        for group in self.groups:
            group.match(req, result)
        branch = self.prefix_cache.branch_point(ids)
        req.snapshot_at = branch if branch > n else 0

    def before_chunk(self, req: Req) -> None:
        """``req``, admitted before, is about to be fed its next prefill chunk."""
        for group in self.groups:
            group.before_chunk(req)

    def trim(self, reqs: list[Req]) -> None:
        """Give back what ``reqs``' next forwards cannot read (before counting what is available;
        ``allocate`` does it too)."""
        for group in self.groups:
            group.trim(reqs)

    def allocate(self, req: Req, new_device_len: int) -> None:
        """Give ``req`` room for ``new_device_len`` positions. Check ``available_tokens``
        first."""
        self.allocate_many([req], [new_device_len])

    def allocate_many(self, reqs: list[Req], new_device_lens: list[int]) -> None:
        """``allocate`` for a whole batch with a handful of tensor ops (decode calls it every
        step)."""
        rows, starts, counts = [], [], []
        for req, new_len in zip(reqs, new_device_lens):
            start = self.alloc_len(req)
            count = round_up(new_len, self.page_size) - start
            if count > 0:
                rows.append(req.table_idx)
                starts.append(start)
                counts.append(count)
        self.trim(reqs)  # before allocating: what it frees serves this step too
        if rows:
            for group in self.groups:
                group.allocate(rows, starts, counts)

    def commit(self, req: Req, kept: int, feed: Feed) -> None:
        """``feed`` verified drafts and was read back: ``req`` keeps its first ``kept``
        positions (those of the tokens it kept, the last excepted: it was never fed). Every group
        gives back what it holds past them, unless the feed kept all its positions: what lies past
        them then belongs to a step drafted ahead on this one (``scheduler/ahead.py``), if any.
        The recurrent state after position ``kept - 1`` becomes the request's."""
        self.commit_many([(req, kept, feed)])

    def commit_many(self, kept: list[tuple[Req, int, Feed]]) -> None:
        """``commit`` for every verify feed of a step, each group called once."""
        commits = []
        for req, n, feed in kept:
            keep = round_up(n, self.page_size)
            commits.append((req, keep, keep if n == feed.device_len else self.alloc_len(req),
                            feed))
            req.cached_len = req.device_len = n
        for group in self.groups:
            group.commit_many(commits)

    def release(self, req: Req) -> None:
        """Return a request's slots: its computed prefix goes to the prefix cache, the rest is
        freed."""
        if req.table_idx >= 0:
            alloc_len = self.alloc_len(req)
            # every fed token's KV is computed, or being computed by a launched forward (stream
            # order makes it available to every later one)
            aligned = req.device_len - req.device_len % self.page_size
            for group in self.groups:
                group.release(req, alloc_len, aligned)
        if req.cache_handle is not None:
            self.prefix_cache.lock_handle(req.cache_handle, unlock=True)
        req.cache_handle = None

    def cache_prefix(self, req: Req) -> None:
        """Share a running request's computed prefix now, not only when it finishes (called when
        the forward that fed its prompt has been read back: all of it is computed)."""
        done = req.device_len - req.device_len % self.page_size
        old = req.cache_handle
        if not self.shares_prefixes or old is None or done <= old.cached_len:
            return
        for group in self.groups:
            group.cache_prefix(req, done)

    def flush(self, new_tokens_of: list[Feed] | None = None) -> list[int] | None:
        """Copy this step's changes to the device (before the batch is prepared).

        ``new_tokens_of``: a decode batch whose CUDA graph writes its new tokens' slots itself
        (``engine/graph.py``): those entries are left out, and their slots returned (host list).
        """
        for group in self.groups[1:]:
            group.flush()
        new = None if new_tokens_of is None else [(f.table_idx, f.device_len - 1)
                                                  for f in new_tokens_of]
        return self.full.pages.flush(new)

    def flush_prefix_cache(self) -> int:
        """Evict every unreferenced cached prefix (all of them when no request runs): tokens
        freed."""
        n = self.prefix_cache.evictable_size
        if n:
            self.full.evict(n)
        return n

    def check_integrity(self, live_reqs: list[Req], thorough: bool = True) -> None:
        """Every group's allocator accounts for all it holds (free + cached + owned == total;
        ``thorough``: no page in two places, the trees' own accounts)."""
        live = [(req, self.alloc_len(req)) for req in live_reqs]
        for group in self.groups:
            group.check_integrity(live, thorough)

