"""RMSNorm, in every family's variant: ``x / rms(x)`` scaled by ``offset + weight``.

* ``offset=1.0``: weights stored centred on zero (Gemma 3, the hybrid Qwen checkpoints);
* ``scale=False``: no weight at all (Gemma 4's v norm, its MoE router's norm);
* ``fp32``: the weight multiplies in float32 and the result is rounded once (Gemma's and the hybrid
  checkpoints' references; implied by an offset); otherwise the normalised x is rounded to x's
  dtype first and multiplied in it (Llama's, ``kernel.ops.rms_norm``).

``forward(x)`` normalises; ``add_norm(x, residual)`` adds the residual stream first and returns
both (``(norm(x + r), x + r)``; residual None on layer 0: ``(norm(x), x)``); ``add_to(stream, x)``
returns ``stream + norm(x)`` (Gemma's sandwich norms: a block's output normalised as it joins the
stream). On CUDA tensors every variant runs the Triton kernels of ``minisgl.kernel.triton.norm``
(one pass, the adds included, imported lazily so CPU-only machines never import triton); the torch
code here is the reference they are tested against and what CPU runs.
"""

from __future__ import annotations

import torch
from torch import nn

from minisgl.kernel.ops import rms_norm
from minisgl.quant.base import QuantizedInput

from .base import new_param

__all__ = ["RMSNorm", "rms_norm"]


class RMSNorm(nn.Module):
    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def __init__(self, size: int, eps: float, *, offset: float = 0.0, scale: bool = True,
                 fp32: bool = False) -> None:
        super().__init__()
        if offset not in (0.0, 1.0):
            raise ValueError(f"RMSNorm offset: 0 or 1, got {offset}")
        self.eps, self.offset = eps, offset
        self.fp32 = fp32 or offset != 0.0
        self.weight = new_param(size) if scale else None

    @property
    def plain(self) -> bool:
        """Llama's ``w * norm(x)``, the form the fused kernels (q/k norm + RoPE, the FP8
        norm-quantize and one-token paths) implement."""
        return self.weight is not None and not self.fp32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from minisgl.kernel.triton.norm import rms_norm as triton_rms_norm

            if x.stride(-1) != 1:  # the kernel reads rows with unit stride (a pooled tower's)
                x = x.contiguous()
            return triton_rms_norm(x, self.weight, self.eps, pdl=self.pdl,
                                   offset=self.offset != 0.0, fp32=self.fp32)
        return self._reference(x)

    def add_to(self, stream: torch.Tensor, x: torch.Tensor,
               mult: torch.Tensor | None = None) -> torch.Tensor:
        """``stream + norm(x)``, the sum of the two rounded tensors (the reference's); times
        ``mult`` (one value: Gemma 4's layer scalar) after it where given."""
        if x.is_cuda and not self.plain and x.is_contiguous() and stream.is_contiguous():
            from minisgl.kernel.triton.norm import rms_norm as triton_rms_norm

            return triton_rms_norm(x, self.weight, self.eps, pdl=self.pdl,
                                   offset=self.offset != 0.0, fp32=True, add=stream, mult=mult)
        out = stream + self.forward(x)
        return out if mult is None else out * mult

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor | None, quantize: bool = False
                 ) -> tuple[torch.Tensor | QuantizedInput, torch.Tensor]:
        """``(norm(x + residual), x + residual)``. ``quantize`` (CUDA, 2-D x, the plain
        variant): the norm comes back quantized per token for the FP8 layer it feeds, a
        ``QuantizedInput`` (``fusion.NormFusion.quantized_inputs``)."""
        if x.is_cuda:
            from minisgl.kernel.triton.norm import fused_add_rms_norm, rms_norm_quant

            if quantize:
                assert self.weight is not None and self.plain, "quantize: the plain variant"
                q, scale, residual = rms_norm_quant(x, self.weight, self.eps, residual,
                                                    pdl=self.pdl)
                return QuantizedInput(q, scale, x.dtype), residual
            if residual is None:
                return self.forward(x), x
            return fused_add_rms_norm(x, residual, self.weight, self.eps, pdl=self.pdl,
                                      offset=self.offset != 0.0, fp32=self.fp32)
        if residual is not None:
            x = x + residual
        return self._reference(x), x

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        if self.plain:
            assert self.weight is not None
            return rms_norm(x, self.weight, self.eps)
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            w = self.weight.float()
            out = out * (w + 1.0 if self.offset else w)
        return out.to(x.dtype)
