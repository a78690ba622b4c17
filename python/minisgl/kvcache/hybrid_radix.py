"""The radix cache of hybrid models: KV pages shared by prefix, as usual, plus snapshots of the
linear layers' recurrent state at chosen node ends.

A request's recurrent state summarises its whole prefix, so a hit can only resume where the
state after exactly that prefix was kept. Policy:

* a snapshot is taken where a request's fed tokens end on a page boundary, when its prompt's
  prefill ends (``cache_prefix``) and when it finishes or is retracted (``release``): the state
  in its slot is then the state after exactly those tokens (every forward that fed them is
  launched, and the copy is stream-ordered after them);
* and at branch points: a new request whose prompt shares cached KV beyond its resumable match
  (a common system prompt, the others' requests diverging after it) ends a prefill chunk where
  that KV ends (``Req.snapshot_at``) and is snapshotted there before its next chunk, so that the
  requests after it resume from the shared part;
* a match ends at the deepest node on the matched path that has a snapshot (``match_resumable``);
  the KV of the rest of the path stays cached for other requests;
* snapshot slots are a fixed part of the state pool (``--num-state-snapshots``); when none is
  free, the least recently used snapshot of an unlocked node is dropped (the node keeps its KV);
  a node evicted for KV room frees its snapshot with it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .base import BaseCacheHandle, MatchResult, empty_slots
from .radix_cache import RadixCacheHandle, RadixPrefixCache, RadixTreeNode, _as_list
from .state_pool import StatePool


class HybridRadixCache(RadixPrefixCache):
    def __init__(self, page_size: int, device: torch.device | str, state_pool: StatePool) -> None:
        self.state_pool = state_pool
        super().__init__(page_size, device)

    def reset(self) -> None:
        """Forget everything; the snapshot slots go back to the state pool."""
        for node in list(getattr(self, "_snapshots", ())):
            self._drop(node)
        super().reset()
        self._snapshots: dict[RadixTreeNode, int] = {}
        self.num_snapshots_taken = 0

    def match_resumable(self, input_ids: Sequence[int]) -> MatchResult:
        ids = _as_list(input_ids)
        node, pos, path = self._walk(ids[: self.aligned_len(len(ids))])
        self._touch(path)
        while path and path[-1].snapshot is None:
            path.pop()
        if not path:
            return MatchResult(RadixCacheHandle(0, self.root), empty_slots())
        indices = torch.cat([n.value for n in path])
        return MatchResult(RadixCacheHandle(len(indices), path[-1]), indices)

    def branch_point(self, input_ids: Sequence[int]) -> int:
        ids = _as_list(input_ids)
        node, pos, _ = self._walk(ids[: self.aligned_len(len(ids))])
        return pos if pos and node.snapshot is None else 0

    def restore_state(self, handle: BaseCacheHandle, slot: int) -> None:
        assert isinstance(handle, RadixCacheHandle)
        if handle.cached_len:
            assert handle.node.snapshot is not None, f"{handle!r} ends at no snapshot"
            self.state_pool.copy_slot(slot, handle.node.snapshot)

    def save_state(self, input_ids: Sequence[int], slot: int) -> None:
        ids = _as_list(input_ids)
        if not ids or len(ids) % self.page_size:
            return
        node, pos, _ = self._walk(ids)
        if pos != len(ids) or node.snapshot is not None:
            return  # not cached (the cache kept a different prefix), or already kept
        snap = self.state_pool.alloc_snapshot()
        if snap is None:
            victims = [n for n in self._snapshots if n.ref_count == 0]
            if not victims:
                return
            self._drop(min(victims, key=lambda n: (n.last_access, n.uid)))
            snap = self.state_pool.alloc_snapshot()
            assert snap is not None  # the victim's slot
        self.state_pool.copy_slot(snap, slot)
        node.snapshot = snap
        self._snapshots[node] = snap
        self.num_snapshots_taken += 1

    def _drop(self, node: RadixTreeNode) -> None:
        self.state_pool.free_snapshot(self._snapshots.pop(node))
        node.snapshot = None

    def _on_evict(self, node: RadixTreeNode) -> None:
        if node.snapshot is not None:
            self._drop(node)

    @property
    def num_snapshots(self) -> int:
        return len(self._snapshots)

    def check_integrity(self) -> None:
        super().check_integrity()
        live = set(self._nodes())
        for node, slot in self._snapshots.items():
            assert node in live and node.snapshot == slot, f"stale snapshot of {node!r}"
        assert sum(n.snapshot is not None for n in live) == len(self._snapshots), \
            "a node's snapshot is not tracked"
        self.state_pool.check_integrity(list(self._snapshots.values()))
