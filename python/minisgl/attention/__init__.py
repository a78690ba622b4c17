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
def _create_torch(kv_pool: BaseKVCachePool, page_table: torch.Tensor, scale: float):
    from .torch_backend import TorchBackend

    return TorchBackend(kv_pool, page_table, scale)


def resolve_attention_backend(name: str, device: torch.device) -> str:
    """Turn ``auto`` into a concrete name for this device."""
    if name != "auto":
        return name
    return "torch"


def create_attention_backend(
    name: str, kv_pool: BaseKVCachePool, page_table: torch.Tensor, scale: float
) -> BaseAttnBackend:
    return ATTN_BACKENDS.get(name)(kv_pool, page_table, scale)


__all__ = [
    "ATTN_BACKENDS",
    "BaseAttnBackend",
    "BaseAttnMetadata",
    "create_attention_backend",
    "resolve_attention_backend",
]
