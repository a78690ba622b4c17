"""RMSNorm, and its fused form that adds the residual first.

On CUDA tensors these run the Triton kernels in ``minisgl.kernel.triton.norm`` (one pass over
memory, imported lazily so CPU-only machines never import triton); the torch code here is the
reference they are tested against and what CPU runs.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.kernel.ops import rms_norm
from minisgl.quant.base import QuantizedInput

from .base import new_param

__all__ = ["RMSNorm", "RMSNormFused", "rms_norm"]


class RMSNorm(nn.Module):
    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from minisgl.kernel.triton.norm import rms_norm as triton_rms_norm

            return triton_rms_norm(x, self.weight, self.eps, pdl=self.pdl)
        return rms_norm(x, self.weight, self.eps)


class RMSNormFused(RMSNorm):
    """``forward(x, residual)`` returns ``(norm(x + residual), x + residual)``; residual None on
    layer 0. ``quantize`` (CUDA, 2-D x): the norm comes back quantized per token for the FP8 layer
    it feeds, a ``QuantizedInput`` (``fusion.NormFusion.quantized_inputs``)."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor | None, quantize: bool = False
    ) -> tuple[torch.Tensor | QuantizedInput, torch.Tensor]:
        if x.is_cuda:
            from minisgl.kernel.triton.norm import fused_add_rms_norm, rms_norm_quant
            from minisgl.kernel.triton.norm import rms_norm as triton_rms_norm

            if quantize:
                q, scale, residual = rms_norm_quant(x, self.weight, self.eps, residual,
                                                    pdl=self.pdl)
                return QuantizedInput(q, scale, x.dtype), residual
            if residual is None:
                return triton_rms_norm(x, self.weight, self.eps, pdl=self.pdl), x
            return fused_add_rms_norm(x, residual, self.weight, self.eps, pdl=self.pdl)
        if residual is not None:
            x = x + residual
        return rms_norm(x, self.weight, self.eps), x
