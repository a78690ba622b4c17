"""The MoE backend interface: given the routing decision, run the selected experts.

The experts come as stacked tensors in one of three storages, told apart by ``scales``:
the model's dtype (``scales`` None), e4m3 with block scales (``FP8Scales``, layout in
``minisgl.quant.fp8``) or packed MXFP4 (``Mxfp4Scales``, layout in ``minisgl.quant.mxfp4``).
Which storage a layer holds is its ``MoEMethod``'s business (``minisgl.quant``); a backend only
runs what it is handed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch

from minisgl.kernel.moe_types import SILU, ExpertBias, FP8Scales, MoeActivation, Mxfp4Scales

__all__ = ["SILU", "BaseMoeBackend", "ExpertBias", "ExpertLayout", "FP8Scales", "MoeActivation",
           "Mxfp4Scales"]


class ExpertLayout(Protocol):
    """A backend's own copy of a layer's experts (``BaseMoeBackend.prepare_experts``)."""

    @property
    def nbytes(self) -> int:
        """What it holds on the device (the model's weight bytes count it)."""
        ...


class BaseMoeBackend(ABC):
    def prepare_experts(self, w13: torch.Tensor, w2: torch.Tensor,
                        scales: FP8Scales | Mxfp4Scales | None, bias: ExpertBias | None,
                        act: MoeActivation) -> ExpertLayout | None:
        """A layout of its own for a layer's loaded experts (``forward``'s arguments as the
        layer holds them), or None (the default: the backend runs them as they are). A layout
        returned replaces them: the layer releases its tensors and passes the layout to every
        ``forward`` (``layout=``), whose ``w13``/``w2``/``scales``/``bias`` are then empty."""
        return None

    @abstractmethod
    def forward(
        self,
        x: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        scales: FP8Scales | Mxfp4Scales | None = None,
        *,
        bias: ExpertBias | None = None,
        act: MoeActivation = SILU,
        pdl: bool = False,
        layout: ExpertLayout | None = None,
    ) -> torch.Tensor:
        """x: [T, H]; w13: [E, 2I, H] (each expert's gate rows, then its up rows); w2: [E, H, I];
        topk_*: [T, K] -> [T, H] (this rank's partial sum).

        ``scales``: with e4m3 ``w13``/``w2``, their block scales
        ``(w13_scale_inv, w2_scale_inv, block)`` (layout in ``minisgl.quant.fp8``); with uint8
        ``w13 [E, 2I, H/2]`` / ``w2 [E, H, I/2]`` (two e2m1 values a byte, the even one in the
        low nibble, as the checkpoint stores them) their ``Mxfp4Scales``. A backend may keep
        them in a layout of its own (the fused Triton MoE: ``quant.mxfp4.to_words``'s word
        layout, made by ``prepare_experts``). ``bias``/``act``: see ``ExpertBias``,
        ``MoeActivation``. ``pdl``: launch Triton kernels with programmatic dependent launch
        (``kernel/triton/pdl.py``); a backend that launches none accepts and ignores it.
        ``layout``: what ``prepare_experts`` returned for this layer, if anything."""
