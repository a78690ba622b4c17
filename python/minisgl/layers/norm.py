"""RMSNorm, and its fused form that adds the residual first (one kernel on GPU, one pass here)."""

from __future__ import annotations

import torch
from torch import nn

from .base import new_param


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, scale in the input dtype (as Hugging Face does, for bit parity)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RMSNormFused(RMSNorm):
    """``forward(x, residual)`` returns ``(norm(x + residual), x + residual)``; residual None on layer 0."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        return rms_norm(x, self.weight, self.eps), x
