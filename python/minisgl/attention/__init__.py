"""Attention backends, chosen by name (``--attn NAME`` or ``--attn PREFILL,DECODE``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minisgl.utils import Registry

from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.kvcache import BaseKVCachePool

ATTN_BACKENDS: Registry[BaseAttnBackend] = Registry("attention backend")


@ATTN_BACKENDS.register("torch")
def _create_torch(kv_pool: BaseKVCachePool, page_table: torch.Tensor):
    from .torch_backend import TorchBackend

    return TorchBackend(kv_pool, page_table)


@ATTN_BACKENDS.register("triton")
def _create_triton(kv_pool: BaseKVCachePool, page_table: torch.Tensor):
    from .triton_backend import TritonBackend  # raises ImportError naming what to install

    return TritonBackend(kv_pool, page_table)


@ATTN_BACKENDS.register("fa")
def _create_fa(kv_pool: BaseKVCachePool, page_table: torch.Tensor):
    from .fa_backend import FlashAttnBackend

    return FlashAttnBackend(kv_pool, page_table)


@ATTN_BACKENDS.register("fi")
def _create_fi(kv_pool: BaseKVCachePool, page_table: torch.Tensor):
    from .fi_backend import FlashInferBackend, check_usable

    check_usable(kv_pool, page_table)
    return FlashInferBackend(kv_pool, page_table)  # raises ImportError naming the extra


# names that other engines (and the seeds) have, refused with the reason rather than "unknown"
REFUSED = {
    "trtllm": "TensorRT-LLM's attention runs only on Blackwell GPUs (sm_100), through "
              "FlashInfer's trtllm-gen kernels; on Hopper (sm_90) and older there is no such "
              "kernel, and minisgl does not offer it untested: use --attn fi or --attn triton",
}


def check_backend_name(name: str) -> None:
    """``ValueError`` unless ``name`` is ``auto``, a backend, or ``PREFILL,DECODE`` of them; a
    refused name says why."""
    parts = name.split(",")
    if len(parts) > 2:
        raise ValueError(f"attn: {name!r}: give NAME or PREFILL,DECODE")
    for part in parts:
        if part in REFUSED:
            raise ValueError(f"attn: {part!r}: {REFUSED[part]}")
        if part != "auto" and part not in ATTN_BACKENDS:
            raise ValueError(f"attn: {part!r} is not one of auto, "
                             f"{', '.join(ATTN_BACKENDS.names)}")


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """Turn ``auto`` into a concrete name for this device: our Triton kernels on CUDA (when triton
    is installed), the reference elsewhere. ``auto`` inside ``PREFILL,DECODE`` resolves the same.

    Not ``fa,triton``: the Triton extend kernel measured as fast as torch's built-in
    FlashAttention for one long prompt, faster for batches, and it also serves cached prefixes
    (docs/performance.md, "Measurements behind the code").
    """
    if "," in name:
        return ",".join(resolve_attention_backend(part, device) for part in name.split(","))
    if name != "auto":
        return name
    from minisgl.kernel import triton_available

    return "triton" if device.type == "cuda" and triton_available() else "torch"


def create_attention_backend(
    name: str, kv_pool: BaseKVCachePool, page_table: torch.Tensor
) -> BaseAttnBackend:
    """``NAME`` or ``PREFILL,DECODE`` (e.g. ``fa,triton``): one backend per phase."""
    names = name.split(",")
    if len(names) == 2 and names[0] != names[1]:
        from .fa_backend import HybridBackend

        prefill, decode = (ATTN_BACKENDS.get(n)(kv_pool, page_table) for n in names)
        return HybridBackend(prefill, decode)
    if len(names) > 2:
        raise ValueError(f"attention backend {name!r}: give NAME or PREFILL,DECODE")
    return ATTN_BACKENDS.get(names[0])(kv_pool, page_table)


__all__ = [
    "ATTN_BACKENDS",
    "REFUSED",
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "check_backend_name",
    "create_attention_backend",
    "resolve_attention_backend",
]
