"""Linear-attention (Gated DeltaNet) backends, chosen by name as attention backends are: ``torch``
(the reference, any device) and ``triton`` (CUDA: in-place state kernels, fla's chunked rule)."""

from __future__ import annotations

import importlib
import threading
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


def prefetch_linear_attn_backend(name: str, device: torch.device) -> None:
    """Start importing what backend ``name`` will import, on a thread of its own, while the
    weights load: fla's package imports every op it has, seconds of the start-up otherwise.
    The backend's own import then finds it done (or waits for it); an import error is left to
    that import, which names the package."""
    if resolve_linear_attn_backend(name, device) != "triton":
        return

    def load() -> None:
        try:
            if device.type == "cuda":  # what its import asks of CUDA, of this worker's GPU
                torch.cuda.set_device(device)
            importlib.import_module("fla.ops.gated_delta_rule")
        except Exception:  # noqa: BLE001 -- raised again, named, by the backend's own import
            pass

    threading.Thread(target=load, name="minisgl-import-fla", daemon=True).start()


__all__ = ["BaseLinearAttnBackend", "LINEAR_ATTN_BACKENDS", "create_linear_attn_backend",
           "prefetch_linear_attn_backend", "resolve_linear_attn_backend"]
