"""KV memory: the paged pool that stores K/V and the prefix caches that share it across requests."""

from __future__ import annotations

import torch

from minisgl.utils import init_logger

from .base import BaseCacheHandle, BaseKVCachePool, BasePrefixCache, MatchResult
from .mha_pool import MHAKVCache
from .naive_cache import NaiveCacheHandle, NaivePrefixCache
from .radix_cache import RadixCacheHandle, RadixPrefixCache
from .spec import CacheSpec
from .state_pool import StatePool

logger = init_logger(__name__)

__all__ = [
    "BaseCacheHandle",
    "BaseKVCachePool",
    "BasePrefixCache",
    "CacheSpec",
    "MatchResult",
    "MHAKVCache",
    "NaiveCacheHandle",
    "NaivePrefixCache",
    "RadixCacheHandle",
    "RadixPrefixCache",
    "PREFIX_CACHES",
    "create_kvcache_pool",
    "create_prefix_cache",
]

PREFIX_CACHES: dict[str, type[BasePrefixCache]] = {
    "radix": RadixPrefixCache,
    "naive": NaivePrefixCache,
}


def create_kvcache_pool(spec: CacheSpec, num_pages: int, page_size: int, dtype: torch.dtype,
                        device: torch.device | str,
                        window_pages: int | None = None) -> BaseKVCachePool:
    """The paged KV pool of ``spec``'s KV layers, each of its own ``(kv_heads, head_dim)``;
    ``window_pages``: the sliding layers in a slot space of that many pages of their own
    (``MHAKVCache``)."""
    shapes = spec.kv_layer_shapes
    windowed = [w is not None for w in spec.windows] if window_pages else None
    return MHAKVCache(spec.num_kv_layers, max(h for h, _ in shapes), max(d for _, d in shapes),
                      num_pages, page_size, dtype, device, shapes, window_pages, windowed)


def create_prefix_cache(name: str, page_size: int, device: torch.device | str,
                        state_pool: StatePool | None = None,
                        window: int | None = None) -> BasePrefixCache:
    """Build the prefix cache called ``name``; slot tensors it returns are int32 on the CPU.

    ``window``: the sliding layers free their pages past this window (a pool of their own): the
    radix cache becomes ``WindowRadixCache``, whose hits resume only where that KV is held.

    A hybrid model (``state_pool``) shares prefixes only through recurrent-state snapshots: the
    radix cache becomes ``HybridRadixCache``, or no sharing when the pool has no snapshot slots
    (a hit without a snapshot would resume the linear layers from a wrong state)."""
    if name not in PREFIX_CACHES:
        choices = ", ".join(sorted(PREFIX_CACHES))
        raise ValueError(f"unknown prefix cache {name!r}; choose one of: {choices}")
    if window is not None and name == "radix":
        if state_pool is not None:
            raise ValueError("sliding_pool_ratio: not supported with recurrent layers")
        from .window_radix import WindowRadixCache

        return WindowRadixCache(page_size, device, window)
    if state_pool is not None and name == "radix":
        if state_pool.num_snapshots > 0:
            from .hybrid_radix import HybridRadixCache

            return HybridRadixCache(page_size, device, state_pool)
        logger.warning("prefix cache 'radix': no state snapshot slots for this hybrid model; "
                       "prefix sharing is off")
        name = "naive"
    return PREFIX_CACHES[name](page_size, device)
