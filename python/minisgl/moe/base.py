"""The MoE backend interface: given the routing decision, run the selected experts."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

FP8Scales = tuple[torch.Tensor, torch.Tensor, tuple[int, int]]


class BaseMoeBackend(ABC):
    @abstractmethod
    def forward(
        self,
        x: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        scales: FP8Scales | None = None,
    ) -> torch.Tensor:
        """x: [T, H]; w13: [E, 2I, H]; w2: [E, H, I]; topk_*: [T, K] -> [T, H]
        (this rank's partial sum).

        ``scales``: with e4m3 ``w13``/``w2``, their block scales
        ``(w13_scale_inv, w2_scale_inv, block)`` (layout in ``minisgl.quant.fp8``)."""
