"""Gated activations. ``silu_and_mul`` runs the Triton kernel (``minisgl.kernel.triton.activation``,
imported lazily) on CUDA tensors; ``silu_and_mul_ref`` is the torch reference that CPU runs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up
