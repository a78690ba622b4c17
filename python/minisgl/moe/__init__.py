"""MoE backends, chosen by name; ``torch`` is the reference every device runs."""

from __future__ import annotations

from minisgl.utils import Registry

from .base import SILU, BaseMoeBackend, ExpertBias, ExpertLayout, MoeActivation, Mxfp4Scales

MOE_BACKENDS: Registry[BaseMoeBackend] = Registry("MoE backend")


@MOE_BACKENDS.register("torch")
def _create_torch() -> BaseMoeBackend:
    from .reference import TorchMoeBackend

    return TorchMoeBackend()


@MOE_BACKENDS.register("triton")
def _create_triton() -> BaseMoeBackend:
    try:
        from .fused import TritonMoeBackend  # imports triton
    except ImportError as e:
        raise ImportError("MoE backend 'triton' needs the triton package "
                          "(pip install triton)") from e
    return TritonMoeBackend()


@MOE_BACKENDS.register("triton_kernels")
def _create_matmul_ogs() -> BaseMoeBackend:
    from .matmul_ogs import MatmulOgsMoeBackend

    try:
        return MatmulOgsMoeBackend()  # imports triton_kernels
    except ImportError as e:
        raise ImportError("MoE backend 'triton_kernels' needs OpenAI's triton_kernels package "
                          "(pip install 'minisgl[triton-kernels]')") from e


@MOE_BACKENDS.register("flashinfer")
def _create_flashinfer() -> BaseMoeBackend:
    from .flashinfer_mxfp4 import FlashInferMoeBackend

    try:
        return FlashInferMoeBackend()  # imports flashinfer
    except ImportError as e:
        raise ImportError("MoE backend 'flashinfer' needs FlashInfer "
                          "(pip install 'minisgl[flashinfer]')") from e


def resolve_moe_backend(name: str, device) -> str:
    """Turn ``auto`` into a concrete name: the fused Triton kernel on CUDA when registered."""
    if name != "auto":
        return name
    return "triton" if device.type == "cuda" and "triton" in MOE_BACKENDS else "torch"


def create_moe_backend(name: str) -> BaseMoeBackend:
    return MOE_BACKENDS.get(name)()


__all__ = ["MOE_BACKENDS", "SILU", "BaseMoeBackend", "ExpertBias", "ExpertLayout", "MoeActivation",
           "Mxfp4Scales", "create_moe_backend", "resolve_moe_backend"]
