"""The contract of a cache group: the caches of one kind of layer (full attention, sliding
window, recurrent state), each kept by a manager of its own behind one coordinator
(``cache.py``), which calls every group at the same points of a request's life.

The coordinator owns the positions: a request's row is allocated to ``alloc_len`` positions in
whole pages (``full_attention.py`` keeps that count); a group that stores something per position
is told which positions each step adds (``allocate``) and gives back what it no longer needs.
Every hook but ``create`` has a default that does nothing, so a group implements what its kind
of cache needs. A new group is a file with a subclass and a line in ``cache.GROUPS``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minisgl.core import Feed, Req
from minisgl.kvcache import BasePrefixCache, MatchResult

if TYPE_CHECKING:
    from minisgl.engine import Engine


class CacheGroup:
    """One group's manager. ``available``/``allocate`` are in tokens of positions (the page
    size is the coordinator's)."""

    @classmethod
    def create(cls, engine: Engine, prefix_cache: BasePrefixCache,
               page_size: int) -> CacheGroup | None:
        """The group for ``engine``'s model (its ``cache_spec``), or None if it has none."""
        raise NotImplementedError

    def available(self) -> int | None:
        """Tokens of positions this group can still hold, evicting what it may (None: it does
        not limit them)."""
        return None

    def match(self, req: Req, result: MatchResult) -> None:
        """``req`` resumes from a prefix hit (``result.handle.cached_len`` tokens)."""

    def before_chunk(self, req: Req) -> None:
        """``req``, admitted before, is about to be fed its next prefill chunk."""

    def trim(self, reqs: list[Req]) -> None:
        """Give back what the next forwards of ``reqs`` can no longer read."""

    def allocate(self, rows: list[int], starts: list[int], counts: list[int]) -> None:
        """Room for positions ``[start, start + count)`` of each row (whole pages); the
        coordinator checked ``available`` first."""

    def commit(self, req: Req, keep: int, end: int, feed: Feed) -> None:
        """A verify feed was read back: ``req`` keeps its first ``req.device_len`` positions
        (``keep``: that, rounded up to a page; ``end``: what was allocated)."""

    def commit_many(self, commits: list[tuple[Req, int, int, Feed]]) -> None:
        """``commit(req, keep, end, feed)`` for each of a step's verify feeds."""
        for req, keep, end, feed in commits:
            self.commit(req, keep, end, feed)

    def release(self, req: Req, alloc_len: int, aligned: int) -> None:
        """``req`` is done with its row (finished, aborted, retracted): what it held goes back, or
        to the prefix cache for its first ``aligned`` positions (a whole number of pages)."""

    def cache_prefix(self, req: Req, done: int) -> None:
        """``req``'s first ``done`` positions entered the prefix cache while it runs."""

    def flush(self) -> None:
        """Before a forward: this step's changes to the device."""

    @property
    def draft_groups(self) -> int | None:
        """How many verify feeds one step may have (None: no limit from this group)."""
        return None

    def draft_slot(self, group: int) -> int:
        """Where verify feed ``group`` of a step leaves this group's per-position state (-1:
        nowhere)."""
        return -1

    def check_integrity(self, live: list[tuple[Req, int]], thorough: bool = True) -> None:
        """The group's allocator accounts for everything; ``live``: (request, alloc_len).
        ``thorough``: also what costs a sort of the pool (no page in two places)."""
