"""KV memory: the paged pool that stores K/V and the prefix caches that share it across requests."""

from __future__ import annotations

import torch

from .base import BaseCacheHandle, BaseKVCachePool, BasePrefixCache, MatchResult
from .mha_pool import MHAKVCache
from .naive_cache import NaiveCacheHandle, NaivePrefixCache
from .radix_cache import RadixCacheHandle, RadixPrefixCache

__all__ = [
    "BaseCacheHandle",
    "BaseKVCachePool",
    "BasePrefixCache",
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


def create_kvcache_pool(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    num_pages: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> BaseKVCachePool:
    return MHAKVCache(num_layers, num_kv_heads, head_dim, num_pages, page_size, dtype, device)


def create_prefix_cache(name: str, page_size: int, device: torch.device | str) -> BasePrefixCache:
    """Build the prefix cache called ``name``; slot tensors it returns are int32 on the CPU."""
    if name not in PREFIX_CACHES:
        choices = ", ".join(sorted(PREFIX_CACHES))
        raise ValueError(f"unknown prefix cache {name!r}; choose one of: {choices}")
    return PREFIX_CACHES[name](page_size, device)
