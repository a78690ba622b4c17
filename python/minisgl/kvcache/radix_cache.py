"""A radix tree over token ids whose edges carry the KV slots of those tokens, shared by prefix."""

from __future__ import annotations

import heapq
import itertools
from typing import Sequence

import torch

from .base import BaseCacheHandle, BasePrefixCache, MatchResult, empty_slots

__all__ = ["RadixTreeNode", "RadixCacheHandle", "RadixPrefixCache"]

_VECTOR_CMP_MIN = 64


def _as_list(ids: Sequence[int] | torch.Tensor) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)


def _common_len(a: list[int], b: list[int]) -> int:
    """Length of the common prefix; equal slices compare in C, long mismatches in torch."""
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    if a == b:
        return n
    if n >= _VECTOR_CMP_MIN:
        return int(torch.nonzero(torch.tensor(a) != torch.tensor(b))[0])
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


class RadixTreeNode:
    """One edge of the tree: ``key`` tokens (a whole number of pages) and their ``value`` slots."""

    __slots__ = ("key", "value", "parent", "children", "ref_count", "last_access", "uid",
                 "snapshot", "window")
    _uids = itertools.count()

    def __init__(
        self, key: list[int], value: torch.Tensor, parent: RadixTreeNode | None, tick: int
    ) -> None:
        self.key = key
        self.value = value
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixTreeNode] = {}
        self.ref_count = 0
        self.last_access = tick
        self.uid = next(self._uids)
        self.snapshot: int | None = None  # a state slot (hybrid models: hybrid_radix.py)
        # the sliding layers' slots of the same tokens, -1 where freed (window_radix.py)
        self.window: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return f"RadixTreeNode(len={len(self)}, ref={self.ref_count}, t={self.last_access})"


class RadixCacheHandle(BaseCacheHandle):
    """Points at the deepest matched node; the matched prefix is the path from the root to it."""

    __slots__ = ("cached_len", "node")

    def __init__(self, cached_len: int, node: RadixTreeNode) -> None:
        self.cached_len = cached_len
        self.node = node

    def __repr__(self) -> str:
        return f"RadixCacheHandle(cached_len={self.cached_len}, node={self.node!r})"


class RadixPrefixCache(BasePrefixCache):
    """Prefix cache as a radix tree with page-sized edges, LRU eviction of unlocked leaves.

    Splitting keeps the original node object as the lower half, so handles taken before a split
    still point at the node that ends their prefix, and locks survive splits because both halves
    inherit the ref count. Recency is a counter, not wall time, so eviction order is reproducible.
    """

    def __init__(self, page_size: int, device: torch.device | str = "cpu") -> None:
        super().__init__(page_size, device)
        self.reset()

    def reset(self) -> None:
        """Forget everything; the caller reclaims the slots the tree held (resets its allocator)."""
        self._clock = itertools.count(1)
        self.root = RadixTreeNode([], empty_slots(), None, 0)
        self._leaves: set[RadixTreeNode] = set()
        self._evictable = 0
        self._protected = 0

    @property
    def evictable_size(self) -> int:
        return self._evictable

    @property
    def protected_size(self) -> int:
        return self._protected

    def match_prefix(self, input_ids: Sequence[int]) -> MatchResult:
        ids = _as_list(input_ids)
        node, pos, path = self._walk(ids[: self.aligned_len(len(ids))])
        self._touch(path)
        indices = torch.cat([n.value for n in path]) if path else empty_slots()
        return MatchResult(RadixCacheHandle(pos, node), indices)

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        assert isinstance(handle, RadixCacheHandle), f"foreign handle {handle!r}"
        path, node = [], handle.node
        while node is not self.root:
            if node.parent is None:
                raise RuntimeError(f"stale {handle!r}: its prefix was evicted or the cache reset")
            path.append(node)
            node = node.parent
        if unlock and any(n.ref_count == 0 for n in path):
            raise RuntimeError(f"unlock of an unlocked {handle!r}")
        delta = -1 if unlock else 1
        for n in path:
            if n.ref_count == (1 if unlock else 0):
                self._evictable -= len(n) * delta
                self._protected += len(n) * delta
                self._on_lock_change(n, delta)
            n.ref_count += delta

    def _on_lock_change(self, node: RadixTreeNode, delta: int) -> None:
        """Called when ``node`` becomes locked (``delta`` 1) or unlocked (-1)."""

    def insert_prefix(self, input_ids: Sequence[int], indices: torch.Tensor) -> torch.Tensor:
        ids = _as_list(input_ids)
        n = self.aligned_len(len(ids))
        if len(indices) < n:
            raise ValueError(f"indices: {len(indices)} slots offered for {n} tokens")
        offered = indices[:n].to("cpu", torch.int32)
        node, pos, path = self._walk(ids[:n])
        duplicates, start = [], 0
        for on_path in path:
            seg = offered[start : start + len(on_path)]
            duplicates.append(seg[seg != on_path.value])
            start += len(on_path)
        if pos < n:
            path.append(self._add_child(node, ids[pos:n], offered[pos:].clone()))
        self._touch(path)
        return torch.cat(duplicates) if duplicates else empty_slots()

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens <= 0:
            return empty_slots()
        if num_tokens > self._evictable:
            raise RuntimeError(
                f"cannot evict {num_tokens} tokens: only {self._evictable} evictable "
                f"({self._protected} locked)"
            )
        heap = [(n.last_access, n.uid, n) for n in self._leaves if n.ref_count == 0]
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        total = 0
        while total < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[tuple(leaf.key[: self.page_size])]
            leaf.parent = None
            self._leaves.discard(leaf)
            self._evictable -= len(leaf)
            total += len(leaf)
            self._on_evict(leaf)
            freed.append(leaf.value)
            if parent is not self.root and not parent.children:
                self._leaves.add(parent)
                if parent.ref_count == 0:
                    heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return torch.cat(freed)

    def _on_evict(self, node: RadixTreeNode) -> None:
        """Called for every node ``evict`` removes (a subclass frees what the node owned)."""

    def _touch(self, path: list[RadixTreeNode]) -> None:
        tick = next(self._clock)
        for node in path:
            node.last_access = tick

    def _walk(self, ids: list[int]) -> tuple[RadixTreeNode, int, list[RadixTreeNode]]:
        """Match page-aligned ``ids`` node by node; a match ending inside a node splits it there."""
        node, pos, path = self.root, 0, []
        p = self.page_size
        while pos < len(ids):
            child = node.children.get(tuple(ids[pos : pos + p]))
            if child is None:
                break
            m = _common_len(child.key, ids[pos : pos + len(child)]) // p * p
            partial = m < len(child)
            node, pos = (self._split(child, m) if partial else child), pos + m
            path.append(node)
            if partial:
                break
        return node, pos, path

    def _split(self, node: RadixTreeNode, m: int) -> RadixTreeNode:
        """Cut ``node`` after ``m`` tokens; returns the new upper half, ``node`` keeps the rest."""
        assert 0 < m < len(node) and m % self.page_size == 0
        parent = node.parent
        assert parent is not None
        upper = RadixTreeNode(node.key[:m], node.value[:m].clone(), parent, node.last_access)
        upper.ref_count = node.ref_count
        parent.children[tuple(upper.key[: self.page_size])] = upper
        node.key, node.value = node.key[m:], node.value[m:].clone()
        if node.window is not None:
            upper.window, node.window = node.window[:m].clone(), node.window[m:].clone()
        node.parent = upper
        upper.children[tuple(node.key[: self.page_size])] = node
        return upper

    def _add_child(
        self, parent: RadixTreeNode, key: list[int], value: torch.Tensor
    ) -> RadixTreeNode:
        child = RadixTreeNode(key, value, parent, 0)
        parent.children[tuple(key[: self.page_size])] = child
        self._leaves.discard(parent)
        self._leaves.add(child)
        self._evictable += len(child)
        return child

    def _nodes(self) -> list[RadixTreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_integrity(self) -> None:
        p = self.page_size

        def require(ok: bool, msg: str) -> None:
            if not ok:
                raise AssertionError(msg)

        nodes = self._nodes()
        evictable = protected = 0
        for node in nodes:
            parent = node.parent
            require(parent is not None, f"{node!r} has no parent")
            assert parent is not None
            require(len(node) > 0 and len(node) % p == 0, f"{node!r}: key not whole pages")
            require(len(node) == len(node.value), f"{node!r}: key/value length differ")
            require(node.value.dtype == torch.int32, f"{node!r}: value is {node.value.dtype}")
            require(parent.children.get(tuple(node.key[:p])) is node, f"{node!r}: bad child key")
            require(node.ref_count >= 0, f"{node!r}: negative ref count")
            if parent is not self.root:
                require(parent.ref_count >= node.ref_count, f"{node!r}: ref exceeds parent's")
            require((node in self._leaves) == (not node.children), f"{node!r}: leaf set stale")
            if node.ref_count:
                protected += len(node)
            else:
                evictable += len(node)
        require(len(self._leaves) == sum(not n.children for n in nodes), "leaf set has extras")
        require(evictable == self._evictable, f"evictable {self._evictable} != {evictable}")
        require(protected == self._protected, f"protected {self._protected} != {protected}")
        slots = torch.cat([n.value for n in nodes]) if nodes else empty_slots()
        require(len(torch.unique(slots)) == len(slots), "a slot is stored twice")
        pages = slots.view(-1, p)
        offsets = torch.arange(p, dtype=torch.int32)
        require(
            bool((pages[:, 0] % p == 0).all()) and bool((pages == pages[:, :1] + offsets).all()),
            "slots do not form whole pages",
        )
