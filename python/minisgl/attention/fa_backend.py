"""FlashAttention for prefill, and the hybrid that pairs one backend's prefill with another's
decode.

A prefill in which no request has a cached prefix needs no pool reads at all: the new K/V of each
request are its whole context, packed back to back, which is exactly FlashAttention's ragged
("varlen") input::

    q [T, Hq, D], k/v [T, Hkv, D]    cu_seqlens_q == cu_seqlens_k = [0, e0, e0+e1, ...]   causal

Two implementations, picked once: the ``flash_attn`` package (``flash_attn_varlen_func``) when it
is installed, else the FlashAttention that ships inside torch (``torch.nn.attention.varlen``,
torch >= 2.9; its keyword arguments changed between releases, so they are read off its signature).
Everything else (decode, prefixes, float32, which FlashAttention does not take, and layers with a
sliding window or sinks) goes to the Triton backend, which this one wraps.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .base import AttentionSpec, BaseAttnBackend

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache import BaseKVCachePool

# (q, k, v, cu_seqlens, max_len, scale) -> out, causal
VarlenFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor
]


def _flash_attn_varlen() -> VarlenFn | None:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None

    def run(q, k, v, cu, max_len, scale):
        return flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, softmax_scale=scale,
                                      causal=True)

    return run


def _torch_varlen() -> VarlenFn | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    has_scale = "scale" in params
    has_gqa = "enable_gqa" in params

    def run(q, k, v, cu, max_len, scale):
        kwargs = dict(causal)
        if has_scale:
            kwargs["scale"] = scale
        else:  # the default scale is 1/sqrt(D): fold ours into q
            q = q * (scale * q.shape[-1] ** 0.5)
        if has_gqa and q.shape[1] != k.shape[1]:
            kwargs["enable_gqa"] = True
        out = varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    return run


def find_varlen() -> tuple[str, VarlenFn]:
    """The first FlashAttention varlen implementation that imports, or an error saying what to
    do."""
    for name, finder in (("flash_attn", _flash_attn_varlen), ("torch", _torch_varlen)):
        fn = finder()
        if fn is not None:
            return name, fn
    raise ImportError(
        "the 'fa' attention backend needs FlashAttention: `pip install flash-attn`, "
        "or torch >= 2.9 (torch.nn.attention.varlen); or use --attn triton"
    )


class FlashAttnBackend(BaseAttnBackend):
    """FlashAttention for prefills without a cached prefix; the Triton backend for the rest."""

    supports_cuda_graph = True  # decode is the Triton backend's
    supports_window = supports_sinks = True  # such layers go to the Triton backend
    supports_image_blocks = True  # ... and so do image blocks

    def __init__(self, kv_pool: BaseKVCachePool, page_table: torch.Tensor) -> None:
        from .triton_backend import TritonBackend, TritonPrefillMetadata  # needs triton

        self.impl, self.varlen = find_varlen()
        self.triton = TritonBackend(kv_pool, page_table)
        self.graph_metadata_rows = self.triton.graph_metadata_rows
        self._prefill_meta = TritonPrefillMetadata
        self.kv_pool = kv_pool

    def check_layers(self, specs: list[AttentionSpec]) -> None:
        self.triton.check_layers(specs)

    def set_window_page_table(self, table: torch.Tensor) -> None:
        self.triton.set_window_page_table(table)

    def prepare_metadata(self, batch: Batch) -> None:
        self.triton.prepare_metadata(batch)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
        batch: Batch, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        meta = batch.attn_metadata
        usable = (
            isinstance(meta, self._prefill_meta) and meta.no_prefix
            and q.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype
            and spec.sliding_window is None and spec.sinks is None
            and not (spec.image_blocks and batch.images is not None
                     and batch.images.key_limits is not None)
        )
        if not usable:
            return self.triton.forward(q, k, v, spec, batch, out)
        res = self.varlen(q, k, v, meta.cu_seqlens, meta.max_extend, spec.scale)
        return res if out is None else out.copy_(res)

    def init_cuda_graph(self, max_bs: int) -> None:
        self.triton.init_cuda_graph(max_bs)

    def prepare_for_capture(self, batch: Batch, bufs: torch.Tensor) -> None:
        self.triton.prepare_for_capture(batch, bufs)

    def replay_metadata(self, batch: Batch, padded_bs: int) -> list[list[int]]:
        return self.triton.replay_metadata(batch, padded_bs)


class HybridBackend(BaseAttnBackend):
    """``--attn PREFILL,DECODE``: each phase's metadata and forward go to its own backend."""

    def __init__(self, prefill: BaseAttnBackend, decode: BaseAttnBackend) -> None:
        self.prefill, self.decode = prefill, decode
        self.supports_image_blocks = prefill.supports_image_blocks  # no image token decodes
        self.supports_cuda_graph = decode.supports_cuda_graph
        self.graph_metadata_rows = decode.graph_metadata_rows
        self.supports_padding = prefill.supports_padding  # padding rows: prefill and mixed only

    def check_layers(self, specs: list[AttentionSpec]) -> None:
        self.prefill.check_layers(specs)
        self.decode.check_layers(specs)

    def set_window_page_table(self, table: torch.Tensor) -> None:
        self.prefill.set_window_page_table(table)
        self.decode.set_window_page_table(table)

    def _pick(self, batch: Batch) -> BaseAttnBackend:
        return self.decode if batch.is_decode else self.prefill

    def prepare_metadata(self, batch: Batch) -> None:
        self._pick(batch).prepare_metadata(batch)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
        batch: Batch, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self._pick(batch).forward(q, k, v, spec, batch, out)

    def init_cuda_graph(self, max_bs: int) -> None:
        self.decode.init_cuda_graph(max_bs)

    def prepare_for_capture(self, batch: Batch, bufs: torch.Tensor) -> None:
        self.decode.prepare_for_capture(batch, bufs)

    def replay_metadata(self, batch: Batch, padded_bs: int) -> list[list[int]]:
        return self.decode.replay_metadata(batch, padded_bs)

    def plan_replay(self, batch: Batch, padded_bs: int) -> None:
        self.decode.plan_replay(batch, padded_bs)
