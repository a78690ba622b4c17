"""The radix cache of sliding-window models whose sliding layers free their pages past the window
(``--sliding-pool-ratio``, ``scheduler/window.py``).

The tree shares the full-attention layers' KV by prefix as usual; each node also carries the
sliding layers' slots of its tokens (``node.window``), -1 where they were freed. A request that
finishes had freed most of its sliding KV already: what it still held (its last window of
tokens) is offered to the tree (``insert_window``), which adopts the pages it lacks.

A hit may resume at position ``n`` only where the sliding KV the queries from ``n`` on read is
present: every page from ``page_floor(n - window + 1)`` to ``n`` (the pages the request would
still hold itself at ``device_len == n``). ``match_resumable`` cuts a match back to the deepest
such ``n``; the full KV beyond stays cached for others::

    matched    0 ........................................... pos
    window     | -1  -1  -1  -1 | held held held held | -1  -1 |
                                  '-- window --'  n: resumable here

So a multi-turn conversation resumes where its previous turn ended (the tree holds that turn's
last window); requests that only share a long system prompt mostly do not, since its sliding KV
was freed while the first of them ran.

Window pages held by unlocked nodes are dropped under window-pool pressure (``evict_window``,
least recently used first, the node keeping its full KV), and freed with their node when it is
evicted (collected for the caller: ``take_freed_window``).
"""

from __future__ import annotations

import heapq
from typing import Sequence

import torch

from .base import BaseCacheHandle, MatchResult, empty_slots
from .radix_cache import RadixCacheHandle, RadixPrefixCache, RadixTreeNode, _as_list


def _held(node: RadixTreeNode) -> int:
    return 0 if node.window is None else int((node.window >= 0).sum())


class WindowRadixCache(RadixPrefixCache):
    def __init__(self, page_size: int, device: torch.device | str, window: int) -> None:
        if not isinstance(window, int) or window <= 0:
            raise ValueError(f"window: must be a positive integer, got {window!r}")
        self.window = window
        super().__init__(page_size, device)

    def reset(self) -> None:
        super().reset()
        self._window_evictable = 0  # sliding slots held by unlocked nodes
        self._window_protected = 0
        self._window_freed: list[torch.Tensor] = []

    @property
    def window_evictable_size(self) -> int:
        return self._window_evictable

    @property
    def window_size(self) -> int:
        """Sliding slots the tree holds."""
        return self._window_evictable + self._window_protected

    # -- matching -------------------------------------------------------------------------------

    def resumable_len(self, window_slots: torch.Tensor) -> int:
        """The deepest page end ``n`` of ``window_slots`` (a matched path's) whose pages from
        ``page_floor(n - window + 1)`` to ``n`` are all present; 0 if none."""
        p = self.page_size
        if not len(window_slots):
            return 0
        present = window_slots.view(-1, p)[:, 0] >= 0
        ends = torch.arange(1, len(present) + 1) * p
        first = (ends - self.window + 1).clamp(min=0) // p  # the first page each end needs
        missing = torch.cumsum(~present, 0)
        before = torch.where(first > 0, missing[(first - 1).clamp(min=0)], 0)
        ok = torch.nonzero(missing - before == 0)
        return int(ok[-1]) * p + p if len(ok) else 0

    def match_resumable(self, input_ids: Sequence[int]) -> MatchResult:
        ids = _as_list(input_ids)
        node, pos, path = self._walk(ids[: self.aligned_len(len(ids))])
        self._touch(path)
        if not path:
            return MatchResult(RadixCacheHandle(0, self.root), empty_slots())
        n = self.resumable_len(torch.cat([self._window_of(x) for x in path]))
        if n == 0:
            return MatchResult(RadixCacheHandle(0, self.root), empty_slots())
        start = 0
        for i, x in enumerate(path):  # the node that ends at n (split where n falls inside one)
            if start + len(x) >= n:
                if start + len(x) > n:
                    path[i] = x = self._split(x, n - start)
                path = path[: i + 1]
                break
            start += len(x)
        return MatchResult(RadixCacheHandle(n, path[-1]), torch.cat([x.value for x in path]))

    def window_slots(self, handle: BaseCacheHandle) -> torch.Tensor:
        """The sliding slots of ``handle``'s prefix, -1 where freed."""
        assert isinstance(handle, RadixCacheHandle), f"foreign handle {handle!r}"
        parts, node = [], handle.node
        while node is not self.root:
            assert node is not None
            parts.append(self._window_of(node))
            node = node.parent
        return torch.cat(parts[::-1]) if parts else empty_slots()

    @staticmethod
    def _window_of(node: RadixTreeNode) -> torch.Tensor:
        return node.window if node.window is not None else torch.full_like(node.value, -1)

    @classmethod
    def _held_slots(cls, node: RadixTreeNode) -> torch.Tensor:
        """The sliding slots ``node`` still holds."""
        window = cls._window_of(node)
        return window[window >= 0]

    # -- insertion and eviction -----------------------------------------------------------------

    def _add_child(self, parent: RadixTreeNode, key: list[int],
                   value: torch.Tensor) -> RadixTreeNode:
        child = super()._add_child(parent, key, value)
        child.window = torch.full_like(value, -1)
        return child

    def insert_window(self, input_ids: Sequence[int], slots: torch.Tensor) -> torch.Tensor:
        """Offer the sliding slots ``slots`` (-1: none offered) of ``input_ids``, a prefix the
        tree holds (``insert_prefix`` first). The tree adopts those of positions where it has
        none; the rest of the offered slots are returned for the caller to free."""
        ids = _as_list(input_ids)
        n = self.aligned_len(len(ids))
        node, pos, path = self._walk(ids[:n])
        if pos != n:
            raise ValueError(f"input_ids: only {pos} of {n} tokens are cached")
        slots = slots.to("cpu", torch.int32)
        rest, start = [slots[n:][slots[n:] >= 0]], 0  # past the cached prefix: not kept
        for x in path:
            seg = slots[start: start + len(x)]
            start += len(x)
            if x.window is None:
                x.window = torch.full_like(x.value, -1)
            adopt = (x.window < 0) & (seg >= 0)
            gained = int(adopt.sum())
            if gained:
                x.window[adopt] = seg[adopt]
                self._count(x, gained)
            rest.append(seg[(seg >= 0) & ~adopt & (seg != x.window)])
        return torch.cat(rest)

    def evict_window(self, num_tokens: int) -> torch.Tensor:
        """Drop the sliding slots of unlocked nodes, least recently used first, until at least
        ``num_tokens`` are freed; returns them (the caller's to free)."""
        if num_tokens <= 0:
            return empty_slots()
        if num_tokens > self._window_evictable:
            raise RuntimeError(f"cannot evict {num_tokens} sliding-window tokens: only "
                               f"{self._window_evictable} evictable")
        heap = [(x.last_access, x.uid, x) for x in self._nodes()
                if x.ref_count == 0 and _held(x)]
        heapq.heapify(heap)
        freed, total = [], 0
        while total < num_tokens:
            _, _, x = heapq.heappop(heap)
            held = self._held_slots(x)
            freed.append(held)
            total += len(held)
            self._count(x, -len(held))
            x.window = torch.full_like(x.value, -1)
        return torch.cat(freed)

    def take_freed_window(self) -> torch.Tensor:
        """The sliding slots of the nodes ``evict`` removed since the last call."""
        freed, self._window_freed = self._window_freed, []
        return torch.cat(freed) if freed else empty_slots()

    def _on_evict(self, node: RadixTreeNode) -> None:
        held = _held(node)
        if held:
            self._window_freed.append(self._held_slots(node))
            self._count(node, -held)

    def _on_lock_change(self, node: RadixTreeNode, delta: int) -> None:
        held = _held(node)
        self._window_evictable -= held * delta
        self._window_protected += held * delta

    def _count(self, node: RadixTreeNode, held: int) -> None:
        if node.ref_count:
            self._window_protected += held
        else:
            self._window_evictable += held

    def check_integrity(self) -> None:
        super().check_integrity()
        p = self.page_size
        nodes = self._nodes()
        evictable = sum(_held(x) for x in nodes if x.ref_count == 0)
        protected = sum(_held(x) for x in nodes if x.ref_count)
        assert evictable == self._window_evictable and protected == self._window_protected, (
            f"window counts {self._window_evictable}/{self._window_protected} != "
            f"{evictable}/{protected}")
        for x in nodes:
            w = self._window_of(x).view(-1, p)
            ok = (w == w[:, :1] + torch.arange(p, dtype=torch.int32)) & (w[:, :1] % p == 0)
            assert bool((ok | (w < 0)).all()) and bool(((w < 0).all(1) | (w >= 0).all(1)).all()), \
                f"{x!r}: sliding slots do not form whole pages"
        held = self.held_window_slots()
        assert len(torch.unique(held)) == len(held), "a sliding slot is stored twice"

    def held_window_slots(self) -> torch.Tensor:
        parts = [self._held_slots(x) for x in self._nodes() if _held(x)]
        return torch.cat(parts) if parts else empty_slots()
