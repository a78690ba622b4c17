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
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "create_attention_backend",
    "resolve_attention_backend",
]
