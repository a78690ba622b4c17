"""Linear-attention (Gated DeltaNet) backends, chosen by name as attention backends are: ``torch``
(the reference, any device) and ``triton`` (CUDA: in-place state kernels, fla's chunked rule)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.utils import Registry

from .base import BaseLinearAttnBackend

if TYPE_CHECKING:
    from minisgl.kvcache.state_pool import StatePool

LINEAR_ATTN_BACKENDS: Registry[BaseLinearAttnBackend] = Registry("linear-attention backend")


@LINEAR_ATTN_BACKENDS.register("torch")
def _create_torch(state_pool: StatePool):
    from .torch_backend import TorchLinearAttnBackend

    return TorchLinearAttnBackend(state_pool)


@LINEAR_ATTN_BACKENDS.register("triton")
def _create_triton(state_pool: StatePool):
    from .triton_backend import TritonLinearAttnBackend  # raises ImportError naming fla-core

    return TritonLinearAttnBackend(state_pool)


def resolve_linear_attn_backend(name: str, device: torch.device) -> str:
    if name != "auto":
        return name
    from minisgl.kernel import triton_available

    return "triton" if device.type == "cuda" and triton_available() else "torch"


def create_linear_attn_backend(name: str, state_pool: StatePool,
                               device: torch.device) -> BaseLinearAttnBackend:
    return LINEAR_ATTN_BACKENDS.get(resolve_linear_attn_backend(name, device))(state_pool)


__all__ = ["BaseLinearAttnBackend", "LINEAR_ATTN_BACKENDS", "create_linear_attn_backend",
           "resolve_linear_attn_backend"]
