"""Gated activations. ``silu_and_mul`` runs the Triton kernel (``minisgl.kernel.triton.activation``,
imported lazily) on CUDA tensors; ``silu_and_mul_ref`` is the torch reference that CPU runs. Both
live in ``minisgl.kernel.ops``, which the quantized linear methods share."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.kernel.ops import silu_and_mul, silu_and_mul_ref

__all__ = ["gelu_and_mul", "silu_and_mul", "silu_and_mul_ref"]


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
