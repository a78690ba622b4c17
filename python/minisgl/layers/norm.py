"""RMSNorm, and its fused form that adds the residual first.

On CUDA tensors these run the Triton kernels in ``minisgl.kernel.triton.norm`` (one pass over memory,
imported lazily so CPU-only machines never import triton); the torch code here is the reference they
are tested against and what CPU runs. ``PendingNorm`` leaves the fused form to the linear layer that
reads its output, which with one token on CUDA computes it inside its GEMV.
"""

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
        if x.is_cuda:
            from minisgl.kernel.triton.norm import rms_norm as triton_rms_norm

            return triton_rms_norm(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


class RMSNormFused(RMSNorm):
    """``forward(x, residual)`` returns ``(norm(x + residual), x + residual)``; residual None on layer 0."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if x.is_cuda:
            from minisgl.kernel.triton.norm import fused_add_rms_norm
            from minisgl.kernel.triton.norm import rms_norm as triton_rms_norm

            if residual is None:
                return triton_rms_norm(x, self.weight, self.eps), x
            return fused_add_rms_norm(x, residual, self.weight, self.eps)
        if residual is not None:
            x = x + residual
        return rms_norm(x, self.weight, self.eps), x


class PendingNorm:
    """``norm(x + residual)`` not computed yet. The linear layer that reads it either normalises x
    as its GEMV reads it (one token on CUDA: ``kernel/triton/gemv.py``'s ``PreNorm``, no kernel of
    the norm's own) or calls ``value()``; afterwards ``residual`` is ``x + residual``."""

    def __init__(self, norm: RMSNormFused, x: torch.Tensor, residual: torch.Tensor | None) -> None:
        self.norm, self.x, self._residual_in = norm, x, residual
        self._residual: torch.Tensor | None = None

    @property
    def residual(self) -> torch.Tensor:
        assert self._residual is not None, "the pending norm was never read"
        return self._residual

    def value(self) -> torch.Tensor:
        y, self._residual = self.norm(self.x, self._residual_in)
        return y

    def prenorm(self):
        """The GEMV's ``PreNorm``, with a new tensor for ``x + residual`` (x itself on layer 0)."""
        from minisgl.kernel.triton.gemv import PreNorm

        if self._residual_in is None:
            self._residual = self.x
            return PreNorm(self.norm.weight, self.norm.eps)
        self._residual = torch.empty_like(self.x)
        return PreNorm(self.norm.weight, self.norm.eps, self._residual_in, self._residual)
