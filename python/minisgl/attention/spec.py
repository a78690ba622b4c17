"""What one attention layer asks of a backend: its shapes, scale, window, sinks and soft-cap.

A layer builds its ``AttentionSpec`` once and hands it to ``backend.forward``; a backend reads
everything layer-specific from it, so a new family (Gemma's sliding layers, gpt-oss's sinks, a
global layer with its own head size) adds data, not a branch per model in every backend. A backend
that cannot honour a feature says so at start-up (``check_supported``), not with wrong numbers.

Window convention (transformers'): a query at position ``p`` sees keys ``k`` with
``p - window < k <= p``, i.e. the last ``window`` positions including its own::

    keys   0 ........ p-window | p-window+1 ........ p | p+1 ...
           not visible         |  visible (window keys) | future (causal)

Sinks (gpt-oss): one learned logit per query head, an extra entry in the softmax's denominator
that carries no value: ``out = sum_k e^{s_k} v_k / (e^{sink} + sum_k e^{s_k})``.

Image blocks (Gemma's vision-language models): the tokens of one image attend to each other both
ways; a query sees keys up to its ``batch.images.key_limits`` entry (its image's last token, or
itself) instead of up to its own position. A window still counts back from the query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import torch

__all__ = ["AttentionSpec", "check_supported"]


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
    rotary: Any = None  # a RotaryConfig (not imported: kvcache.spec imports this module)
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

    @classmethod
    def plain(cls, kv_layer: int, q: torch.Tensor, k: torch.Tensor, scale: float) -> AttentionSpec:
        """A full-attention layer with no extras, its shapes read off ``q``/``k``: what a backend
        assumes when a caller hands it a bare layer index."""
        return cls(kv_layer, q.shape[1], k.shape[1] if k is not None else q.shape[1], q.shape[2],
                   scale)


def check_supported(backend: str, specs: Iterable[AttentionSpec], *, window: bool = True,
                    sinks: bool = True, softcap: bool = True) -> None:
    """Refuse, naming the layer and the feature, a model whose layers ask for what ``backend``
    cannot compute."""
    for spec in specs:
        missing = [name for name, asked, can in (
            ("a sliding window", spec.sliding_window is not None, window),
            ("attention sinks", spec.sinks is not None, sinks),
            ("logit soft-capping", spec.logit_softcap is not None, softcap),
        ) if asked and not can]
        if missing:
            raise ValueError(f"attention backend {backend!r} does not support "
                             f"{' or '.join(missing)} (KV layer {spec.kv_layer}); "
                             f"use --attn triton on CUDA or --attn torch")
