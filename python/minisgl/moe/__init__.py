"""MoE backends, chosen by name; ``torch`` is the reference every device runs."""

from __future__ import annotations

from typing import Callable

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


@MOE_BACKENDS.register("triton_fragments")
def _create_triton_fragments() -> BaseMoeBackend:
    from .fused import TritonFragmentsMoeBackend  # the fragment layout's MXFP4 GEMM

    return TritonFragmentsMoeBackend()


@MOE_BACKENDS.register("triton_fragments_gluon")
def _create_triton_fragments_gluon() -> BaseMoeBackend:
    from .fused import GluonFragmentsMoeBackend  # its table's Gluon tiles on the Gluon kernel

    return GluonFragmentsMoeBackend()


def _library(create: Callable[[], BaseMoeBackend], name: str, what: str,
             extra: str) -> BaseMoeBackend:
    """A backend of an outside library; without the library, an error saying what to install."""
    try:
        return create()  # imports the library
    except ImportError as e:
        raise ImportError(f"MoE backend {name!r} needs {what} "
                          f"(pip install 'minisgl[{extra}]')") from e


@MOE_BACKENDS.register("triton_kernels")
def _create_matmul_ogs() -> BaseMoeBackend:
    from .matmul_ogs import MatmulOgsMoeBackend

    return _library(MatmulOgsMoeBackend, "triton_kernels", "OpenAI's triton_kernels package",
                    "triton-kernels")


@MOE_BACKENDS.register("flashinfer")
def _create_flashinfer() -> BaseMoeBackend:
    from .flashinfer_mxfp4 import FlashInferMoeBackend

    return _library(FlashInferMoeBackend, "flashinfer", "FlashInfer", "flashinfer")


def resolve_moe_backend(name: str, device) -> str:
    """Turn ``auto`` into a concrete name: the fused Triton kernel on CUDA when registered, on
    Hopper with MXFP4 experts in the fragment layout on its Gluon tiles (other experts run as
    ``triton`` there)."""
    if name != "auto":
        return name
    if device.type != "cuda" or "triton" not in MOE_BACKENDS:
        return "torch"
    import torch

    return auto_cuda_backend(torch.cuda.get_device_capability(device))


def auto_cuda_backend(capability: tuple[int, int]) -> str:
    """``auto``'s pick on a CUDA GPU of this compute capability."""
    return "triton_fragments_gluon" if capability == (9, 0) else "triton"


def create_moe_backend(name: str) -> BaseMoeBackend:
    return MOE_BACKENDS.get(name)()


__all__ = ["MOE_BACKENDS", "SILU", "BaseMoeBackend", "ExpertBias", "ExpertLayout", "MoeActivation",
           "Mxfp4Scales", "create_moe_backend", "resolve_moe_backend"]
