"""Elementwise ops both the layers and the quantized linear methods use: the torch references
the Triton kernels are tested against, and SiLU-and-mul's device dispatch.

A leaf module (torch only; Triton imported lazily on CUDA), so ``minisgl.quant`` never imports
``minisgl.layers``: the layers ask the quantization methods, never the other way round.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, scale in the input dtype (as Hugging Face does, for bit parity)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = [gate | up]`` along the last dimension."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``x = [gate | up]``; one fused kernel on CUDA."""
    if x.is_cuda and x.stride(-1) == 1:
        from minisgl.kernel.triton.activation import silu_and_mul as triton_silu_and_mul

        return triton_silu_and_mul(x)
    return silu_and_mul_ref(x)
