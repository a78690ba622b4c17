"""The two halves of KV caching: where K/V live (the pool), who owns which slots (the prefix cache).

Slots are token positions in the pool: ``slot = page * page_size + offset``. A prefix cache never
allocates or frees slots itself; it only takes ownership of slots the caller offers and hands back
the ones it lets go of, so the caller's allocator stays the single source of truth for free memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["BaseKVCachePool", "BaseCacheHandle", "MatchResult", "BasePrefixCache"]


def check_positive_int(name: str, value: object) -> int:
    """Reject bools and non-positive values early, so a bad config names the argument at fault."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    return value


def empty_slots() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int32)


class BaseKVCachePool(ABC):
    """Per-layer K and V buffers of shape ``[num_slots, num_kv_heads, head_dim]``.

    Contract: ``k_cache``/``v_cache`` return views (writes through them land in the pool), and
    ``store_kv`` writes row ``i`` of ``k``/``v`` to slot ``out_loc[i]`` of layer ``layer_id``.
    Slots are addressed as ``page * page_size + offset``, so a page is ``page_size`` adjacent rows.

    An FP8 pool (``dtype == float8_e4m3fn``) stores ``K / k_scale`` and ``V / v_scale`` per layer
    (1.0 unless the checkpoint gives scales); readers multiply back by ``kv_scales(layer_id)``.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.num_pages = check_positive_int("num_pages", num_pages)
        self.page_size = check_positive_int("page_size", page_size)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype: must be a torch.dtype, got {dtype!r}")
        self.dtype = dtype
        self.device = torch.device(device)
        self._scales = [(1.0, 1.0)] * self.num_layers

    @property
    def is_fp8(self) -> bool:
        return self.dtype == torch.float8_e4m3fn

    def kv_scales(self, layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale) of an FP8 layer: stored value * scale = the real K/V."""
        return self._scales[layer_id]

    def set_kv_scales(self, layer_id: int, k_scale: float, v_scale: float) -> None:
        if not (k_scale > 0 and v_scale > 0):
            raise ValueError(f"KV-cache scales of layer {layer_id} must be > 0, "
                             f"got {k_scale}, {v_scale}")
        self._scales = list(self._scales)
        self._scales[layer_id] = (float(k_scale), float(v_scale))

    def read_kv(self, layer_id: int, slots: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``slots`` (any index shape) in ``dtype``, scales applied: the reference
        read."""
        k, v = self.k_cache(layer_id)[slots], self.v_cache(layer_id)[slots]
        if not self.is_fp8:
            return k, v
        ks, vs = self.kv_scales(layer_id)
        return (k.to(torch.float32) * ks).to(dtype), (v.to(torch.float32) * vs).to(dtype)

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    @abstractmethod
    def mem_bytes(self) -> int:
        """The bytes of every K/V buffer (what the engine's memory profile takes off its peak)."""

    @abstractmethod
    def k_cache(self, layer_id: int) -> torch.Tensor: ...

    @abstractmethod
    def v_cache(self, layer_id: int) -> torch.Tensor: ...

    @abstractmethod
    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None: ...


class BaseCacheHandle(ABC):
    """An opaque token for a matched prefix; only the cache that issued it may interpret it.

    Contract: ``cached_len`` is the number of matched tokens, always a multiple of ``page_size``.
    """

    cached_len: int


@dataclass(frozen=True)
class MatchResult:
    """A matched prefix: ``indices`` (int32, CPU) are its slots, ``handle.cached_len`` of them."""

    handle: BaseCacheHandle
    indices: torch.Tensor


class BasePrefixCache(ABC):
    """Shares the KV of common prompt prefixes between requests, at page granularity.

    Contract:

    * ``match_prefix`` returns the longest cached prefix rounded down to a multiple of
      ``page_size`` and marks it recently used. The slots it returns stay owned by the cache.
    * ``lock_handle(h)`` pins the matched path (the node and all its ancestors) against eviction
      until ``lock_handle(h, unlock=True)``. Lock a handle before anything else may call
      ``evict``: an unlocked match can be evicted and its handle then dangles.
    * ``insert_prefix(ids, idx)`` offers the first ``L = len(ids) // page_size * page_size`` tokens
      with slots ``idx[:L]``. The cache takes ownership of the slots it keeps and returns the rest
      of ``idx[:L]`` for the caller to free; the caller always frees ``idx[L:]`` itself.
    * ``evict(n)`` releases unlocked, least recently used leaves until at least ``n`` tokens are
      freed, returns their slots (now the caller's to free), and raises ``RuntimeError`` when fewer
      than ``n`` tokens are evictable.
    * ``evictable_size``/``protected_size`` count tokens held in the cache, unlocked/locked.
    """

    shares_prefixes = True  # False for a cache that never returns a hit (naive)

    def __init__(self, page_size: int, device: torch.device | str = "cpu") -> None:
        self.page_size = check_positive_int("page_size", page_size)
        self.device = torch.device(device)

    def aligned_len(self, n: int) -> int:
        return n // self.page_size * self.page_size

    @abstractmethod
    def match_prefix(self, input_ids: Sequence[int]) -> MatchResult: ...

    def match_resumable(self, input_ids: Sequence[int]) -> MatchResult:
        """The longest cached prefix a new request can resume from: ``match_prefix``, except for
        a cache of recurrent state, whose match ends where it holds a state snapshot."""
        return self.match_prefix(input_ids)

    def restore_state(self, handle: BaseCacheHandle, slot: int) -> None:
        """Recurrent-state caches: copy the snapshot at ``handle``'s end into state ``slot``."""

    def branch_point(self, input_ids: Sequence[int]) -> int:
        """Recurrent-state caches: where the cached KV of ``input_ids`` ends when that is deeper
        than ``match_resumable`` (a prefix others share, with no snapshot there yet); else 0."""
        return 0

    def save_state(self, input_ids: Sequence[int], slot: int) -> None:
        """Recurrent-state caches: ``slot`` holds the state after exactly ``input_ids`` (a cached
        prefix of whole pages); keep a snapshot of it at that prefix's end if memory allows."""

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None: ...

    @abstractmethod
    def insert_prefix(self, input_ids: Sequence[int], indices: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor: ...

    @property
    @abstractmethod
    def evictable_size(self) -> int: ...

    @property
    @abstractmethod
    def protected_size(self) -> int: ...

    @abstractmethod
    def reset(self) -> None: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise ``AssertionError`` if an internal invariant is broken (for tests and debugging)."""
