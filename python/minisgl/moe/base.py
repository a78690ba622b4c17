"""The MoE backend interface: given the routing decision, run the selected experts."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class BaseMoeBackend(ABC):
    @abstractmethod
    def forward(
        self,
        x: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        """x: [T, H]; w13: [E, 2I, H]; w2: [E, H, I]; topk_*: [T, K] -> [T, H] (this rank's partial sum)."""
