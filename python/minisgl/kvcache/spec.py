"""What a model asks of the engine's caches: ``model.cache_spec()`` returns a ``CacheSpec``.

The engine sizes its pools from this alone (no probing of model attributes): the paged KV pool
gets one layer per KV layer, each of its own ``(kv_heads, head_dim)``; the sliding layers and their
windows are listed for the backends and the page accounting; a hybrid model's recurrent layers
get a state pool of ``num_state_layers`` layers of ``state_shape`` per slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minisgl.attention.spec import AttentionSpec

from .state_pool import StateShape

__all__ = ["CacheSpec"]


@dataclass(frozen=True)
class CacheSpec:
    """``attention``: the spec of every attention layer in model order; their ``kv_layer``
    indices are ``0 .. num_kv_layers - 1`` (a layer may share another's). ``state_shape`` and
    ``num_state_layers``: a hybrid model's linear-attention layers (None / 0 otherwise)."""

    attention: tuple[AttentionSpec, ...]
    state_shape: StateShape | None = None
    num_state_layers: int = 0

    def __post_init__(self) -> None:
        if not self.attention:
            raise ValueError("CacheSpec.attention: a model needs at least one attention layer")
        kv = sorted({s.kv_layer for s in self.attention})
        if kv != list(range(len(kv))):
            raise ValueError(f"CacheSpec.attention: KV layers must be 0..n-1, got {kv}")
        if (self.state_shape is None) != (self.num_state_layers == 0):
            raise ValueError("CacheSpec: state_shape and num_state_layers go together")

    def _kv_owner(self, kv_layer: int) -> AttentionSpec:
        return next(s for s in self.attention if s.kv_layer == kv_layer)

    @property
    def num_kv_layers(self) -> int:
        return 1 + max(s.kv_layer for s in self.attention)

    @property
    def kv_layer_shapes(self) -> list[tuple[int, int]]:
        """``(kv_heads, head_dim)`` of each KV layer on this rank."""
        return [(s.num_kv_heads, s.head_dim)
                for s in map(self._kv_owner, range(self.num_kv_layers))]

    @property
    def windows(self) -> list[int | None]:
        """The sliding window of each KV layer (None: full attention)."""
        return [s.sliding_window for s in map(self._kv_owner, range(self.num_kv_layers))]

    @property
    def max_window(self) -> int | None:
        """The widest sliding window (None: no sliding layer)."""
        return max((w for w in self.windows if w is not None), default=None)

    @property
    def has_state(self) -> bool:
        return self.state_shape is not None

    def kv_bytes_per_token(self, dtype: torch.dtype, window_ratio: float | None = None) -> float:
        """K and V bytes of one token over all KV layers, on this rank. ``window_ratio``: the
        sliding layers hold that many tokens per token of the others (their own slot space)."""
        total = 0.0
        for (h, d), w in zip(self.kv_layer_shapes, self.windows):
            share = window_ratio if (w is not None and window_ratio is not None) else 1.0
            total += 2 * h * d * dtype.itemsize * share
        return total
