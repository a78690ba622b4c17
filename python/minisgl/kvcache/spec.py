"""What a model asks of the engine's caches and attention backends: each attention layer's
``AttentionSpec``, and the ``CacheSpec`` that ``model.cache_spec()`` returns. Value types only (a
leaf module: torch and the state shape), so that the layers, the backends and the pools all read
them and none imports another for them (vLLM's ``kv_cache_interface`` holds its specs so too).

A layer builds its ``AttentionSpec`` once and hands it to ``backend.forward``; a backend reads
everything layer-specific from it, so a new family (Gemma's sliding layers, gpt-oss's sinks, a
global layer with its own head size) adds data, not a branch per model in every backend. A backend
that cannot honour a feature says so at start-up (``BaseAttnBackend.check_layers``), not with wrong
numbers.

Window convention (transformers'): a query at position ``p`` sees keys ``k`` with
``p - window < k <= p``, i.e. the last ``window`` positions including its own::

    keys   0 ........ p-window | p-window+1 ........ p | p+1 ...
           not visible         |  visible (window keys) | future (causal)

Sinks (gpt-oss): one learned logit per query head, an extra entry in the softmax's denominator
that carries no value: ``out = sum_k e^{s_k} v_k / (e^{sink} + sum_k e^{s_k})``.

Image blocks (Gemma's vision-language models): the tokens of one image attend to each other both
ways; a query sees keys up to its ``batch.images.key_limits`` entry (its image's last token, or
itself) instead of up to its own position. A window still counts back from the query.

The engine sizes its pools from the ``CacheSpec`` alone (no probing of model attributes): the paged
KV pool gets one layer per KV layer, each of its own ``(kv_heads, head_dim)``; the sliding layers
and their windows are listed for the backends and the page accounting; a hybrid model's recurrent
layers get a state pool of ``num_state_layers`` layers of ``state_shape`` per slot. A speculative
draft head (MTP, EAGLE-3) adds its attention layer as the last KV layer (``draft``): the target's
forward never runs it, the proposer does (``speculative/head.py``), over the same page table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .state_pool import StateShape

__all__ = ["AttentionSpec", "CacheSpec"]


@dataclass(eq=False)
class AttentionSpec:
    """One attention layer, as this rank sees it (heads are the rank's local heads).

    ``kv_layer``: the layer's index in the KV pool (a hybrid model's pool holds its attention
    layers only). ``sinks``: ``[num_qo_heads]`` float32 logits (this rank's heads), or None; the
    layer owns the parameter, the spec holds a reference, so loading weights updates both.
    ``rotary`` is the layer's own RoPE (applied by the layer, recorded for the cache spec).
    """

    kv_layer: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None = None
    sinks: torch.Tensor | None = None
    logit_softcap: float | None = None
    rotary: Any = None  # a RotaryConfig (not imported: models import this module)
    image_blocks: bool = False  # an image's tokens attend to each other both ways

    def __post_init__(self) -> None:
        for name in ("num_qo_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"AttentionSpec.{name}: must be a positive integer, got {value!r}")
        if self.num_qo_heads % self.num_kv_heads:
            raise ValueError(f"AttentionSpec.num_qo_heads ({self.num_qo_heads}) is not a multiple "
                             f"of num_kv_heads ({self.num_kv_heads})")
        if not self.scale > 0:
            raise ValueError(f"AttentionSpec.scale: must be > 0, got {self.scale!r}")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"AttentionSpec.sliding_window: must be None or > 0, "
                             f"got {self.sliding_window!r}")
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            raise ValueError(f"AttentionSpec.logit_softcap: must be None or > 0, "
                             f"got {self.logit_softcap!r}")

    @property
    def window(self) -> int:
        """The window as a kernel argument: 0 means none."""
        return self.sliding_window or 0

    def out_loc(self, batch) -> torch.Tensor:
        """Where this step's K/V go: a sliding layer's own slot space when the engine keeps one
        (``batch.window_out_loc``), else the shared one."""
        if self.sliding_window is not None and batch.window_out_loc is not None:
            return batch.window_out_loc
        return batch.out_loc


@dataclass(frozen=True)
class CacheSpec:
    """``attention``: the spec of every attention layer of the model's forward, in model order;
    with ``draft`` (a draft head's attention, after them) their ``kv_layer`` indices are
    ``0 .. num_kv_layers - 1`` (a layer may share another's). ``state_shape`` and
    ``num_state_layers``: a hybrid model's linear-attention layers (None / 0 otherwise)."""

    attention: tuple[AttentionSpec, ...]
    state_shape: StateShape | None = None
    num_state_layers: int = 0
    draft: AttentionSpec | None = None

    def __post_init__(self) -> None:
        if not self.attention:
            raise ValueError("CacheSpec.attention: a model needs at least one attention layer")
        kv = sorted({s.kv_layer for s in self.layers})
        if kv != list(range(len(kv))):
            raise ValueError(f"CacheSpec.attention: KV layers must be 0..n-1, got {kv}")
        if self.draft is not None and self.draft.kv_layer != kv[-1]:
            raise ValueError("CacheSpec.draft: the draft head's KV layer must be the last")
        if (self.state_shape is None) != (self.num_state_layers == 0):
            raise ValueError("CacheSpec: state_shape and num_state_layers go together")

    @property
    def layers(self) -> tuple[AttentionSpec, ...]:
        """Every attention layer the KV pool and the backend serve: the model's, then the draft
        head's."""
        return self.attention if self.draft is None else (*self.attention, self.draft)

    def _kv_owner(self, kv_layer: int) -> AttentionSpec:
        return next(s for s in self.layers if s.kv_layer == kv_layer)

    @property
    def num_kv_layers(self) -> int:
        return 1 + max(s.kv_layer for s in self.layers)

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
