"""A prefix cache that caches nothing: the baseline, and the choice when sharing is unwanted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .base import BaseCacheHandle, BasePrefixCache, MatchResult, empty_slots

__all__ = ["NaiveCacheHandle", "NaivePrefixCache"]


@dataclass(frozen=True)
class NaiveCacheHandle(BaseCacheHandle):
    cached_len: int = 0


class NaivePrefixCache(BasePrefixCache):
    """Never matches and keeps no slot, so every offered slot goes straight back to the caller.

    It honours the full contract, so the scheduler needs no special case for it.
    """

    shares_prefixes = False

    def match_prefix(self, input_ids: Sequence[int]) -> MatchResult:
        return MatchResult(NaiveCacheHandle(), empty_slots())

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        assert isinstance(handle, NaiveCacheHandle), f"foreign handle {handle!r}"

    def insert_prefix(self, input_ids: Sequence[int], indices: torch.Tensor) -> torch.Tensor:
        n = self.aligned_len(len(input_ids))
        if len(indices) < n:
            raise ValueError(f"indices: {len(indices)} slots offered for {n} tokens")
        return indices[:n].to("cpu", torch.int32)

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens > 0:
            raise RuntimeError(f"cannot evict {num_tokens} tokens: the naive cache holds none")
        return empty_slots()

    @property
    def evictable_size(self) -> int:
        return 0

    @property
    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def check_integrity(self) -> None:
        pass
