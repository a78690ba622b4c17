"""The multi-head-attention KV pool: one buffer per distinct layer shape for all layers' K and V."""

from __future__ import annotations

from typing import Sequence

import torch

from minisgl.quant.fp8 import quantize_kv

from .base import BaseKVCachePool, check_positive_int

__all__ = ["MHAKVCache"]


class MHAKVCache(BaseKVCachePool):
    """K and V of every layer, the layers of one shape in one
    ``[2, layers_of_that_shape, num_slots, kv_heads, head_dim]`` tensor.

    ``layer_shapes`` (``(kv_heads, head_dim)`` per layer) gives layers shapes of their own (Gemma
    4's global layers: head size 512, 2 KV heads, beside local layers of 256); without it every
    layer is ``(num_kv_heads, head_dim)``. Every layer has the same slots, so one page table
    serves all. Few allocations keep the footprint exact and let ``k_cache``/``v_cache`` be free
    views. The buffers are zeroed so that reads of never-written slots are deterministic.

    ``window_pages`` (with ``windowed``, a flag per layer): the sliding-window layers live in a
    slot space of their own, of ``window_pages`` pages, addressed through a page table of their
    own (``scheduler/cache.py`` frees its pages past the window); the others have ``num_pages``.
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
        layer_shapes: Sequence[tuple[int, int]] | None = None,
        window_pages: int | None = None,
        windowed: Sequence[bool] | None = None,
    ) -> None:
        super().__init__(num_layers, num_kv_heads, head_dim, num_pages, page_size, dtype, device)
        if layer_shapes is None:
            layer_shapes = [(num_kv_heads, head_dim)] * num_layers
        if len(layer_shapes) != num_layers:
            raise ValueError(f"layer_shapes: {len(layer_shapes)} shapes for {num_layers} layers")
        for heads, dim in layer_shapes:
            check_positive_int("layer_shapes kv_heads", heads)
            check_positive_int("layer_shapes head_dim", dim)
        self.layer_shapes = [tuple(s) for s in layer_shapes]
        self.window_pages = window_pages
        if window_pages is None:
            windowed = [False] * num_layers
        elif windowed is None or len(windowed) != num_layers:
            raise ValueError("windowed: one flag per layer goes with window_pages")
        else:
            check_positive_int("window_pages", window_pages)
        # a layer's buffer key: its shape and its slot space
        keys = [(h, d, bool(w)) for (h, d), w in zip(self.layer_shapes, windowed)]
        groups = sorted(set(keys))
        # layer -> (its group's buffer, its index in that buffer)
        self._where = [(groups.index(k), keys[:i].count(k)) for i, k in enumerate(keys)]
        self._bufs = [
            torch.zeros((2, keys.count(k), self._slots(k[2]), k[0], k[1]), dtype=dtype,
                        device=self.device)
            for k in groups
        ]

    def _slots(self, windowed: bool) -> int:
        if not windowed:
            return self.num_slots
        assert self.window_pages is not None
        return self.window_pages * self.page_size

    @property
    def mem_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._bufs)

    def _layer(self, layer_id: int) -> torch.Tensor:
        if not 0 <= layer_id < self.num_layers:
            raise IndexError(f"layer_id {layer_id} out of range [0, {self.num_layers})")
        buf, idx = self._where[layer_id]
        return self._bufs[buf][:, idx]

    def k_cache(self, layer_id: int) -> torch.Tensor:
        return self._layer(layer_id)[0]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        return self._layer(layer_id)[1]

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Scatter rows of ``k``/``v`` (``[T, kv_heads, head_dim]``) to slots ``out_loc[T]``."""
        kv = self._layer(layer_id)
        if self.is_fp8:
            ks, vs = self.kv_scales(layer_id)
            k, v = quantize_kv(k, ks), quantize_kv(v, vs)
        kv[0][out_loc] = k.to(self.dtype)
        kv[1][out_loc] = v.to(self.dtype)
