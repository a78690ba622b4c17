"""The multi-head-attention KV pool: one contiguous buffer for all layers' K and V."""

from __future__ import annotations

import torch

from minisgl.quant.fp8 import quantize_kv

from .base import BaseKVCachePool

__all__ = ["MHAKVCache"]


class MHAKVCache(BaseKVCachePool):
    """K and V of every layer in one ``[2, num_layers, num_slots, num_kv_heads, head_dim]`` tensor.

    A single allocation keeps the pool's memory footprint exact and lets ``k_cache``/``v_cache``
    be free views. The buffer is zeroed so that reads of never-written slots are deterministic.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__(num_layers, num_kv_heads, head_dim, num_pages, page_size, dtype, device)
        shape = (2, num_layers, self.num_slots, num_kv_heads, head_dim)
        self._kv = torch.zeros(shape, dtype=dtype, device=self.device)

    @property
    def mem_bytes(self) -> int:
        return self._kv.numel() * self._kv.element_size()

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv[0, layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._kv[1, layer_id]

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Scatter rows of ``k``/``v`` (``[T, num_kv_heads, head_dim]``) to slots ``out_loc[T]``."""
        if not 0 <= layer_id < self.num_layers:
            raise IndexError(f"layer_id {layer_id} out of range [0, {self.num_layers})")
        if self.is_fp8:
            ks, vs = self.kv_scales(layer_id)
            k, v = quantize_kv(k, ks), quantize_kv(v, vs)
        self._kv[0, layer_id][out_loc] = k.to(self.dtype)
        self._kv[1, layer_id][out_loc] = v.to(self.dtype)
