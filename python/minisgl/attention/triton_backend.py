"""The Triton backend: our own paged kernels, split-K decode and causal extend with a prefix.

Metadata is a handful of int32 device vectors built on the host, sent in one pinned copy::

    decode : rows [B], seq_lens [B], order [B]           + num_splits (host int, from B only)
    prefill: rows [B], seq_lens [B], cu_seqlens [B+1]    + max_extend, no_prefix (host)
    mixed  : a decode part for the leading decode rows, a prefill part for the rest
             (``mixed_decode_kernel``; otherwise one prefill part: the extend kernel takes a decode
             row as a one-token extend)

``order`` lists the requests longest first, the order in which the decode kernel starts their
programs (``decode_attention``'s docstring: it keeps long requests from finishing alone).

For CUDA graphs, decode reads rows/seq_lens/order from the graph runner's static ``[3, bs]``
rows, which it refreshes with ``replay_metadata`` in the same transfer as its own inputs, and the
split workspace is one static allocation sized for the largest ``bs * num_splits(bs)``;
``num_splits`` depends on the batch size alone, so eager and replayed decode of the same batch run
the same launches and give the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minisgl.utils.transfer import to_device

from .base import AttentionSpec, BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache import BaseKVCachePool

try:
    from minisgl.kernel.triton.decode_attention import (
        choose_num_splits,
        decode_attention,
        longest_first,
    )
    from minisgl.kernel.triton.extend_attention import extend_attention
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"the 'triton' attention backend needs the triton package ({exc}); install it with "
        "`pip install triton` (it ships with CUDA builds of torch), or use --attn torch"
    ) from exc


def _limits(batch: Batch, spec: AttentionSpec, skip: int) -> torch.Tensor | None:
    """The key limits of the batch's tokens from ``skip`` on, when ``spec``'s layer lets an
    image's tokens see each other (``AttentionSpec.image_blocks``) and the batch has images."""
    images = batch.images
    if not spec.image_blocks or images is None or images.key_limits is None:
        return None
    return images.key_limits[skip:]


def _decode_lists(reqs: list) -> list[list[int]]:
    """A decode batch's host-side metadata: page-table rows, lengths, the longest-first order."""
    lens = [r.device_len for r in reqs]
    return [[r.table_idx for r in reqs], lens, longest_first(lens)]


@dataclass
class TritonDecodeMetadata(BaseAttnMetadata):
    rows: torch.Tensor  # [B] int32 page-table row of each request
    seq_lens: torch.Tensor  # [B] int32 context length incl. the new token
    order: torch.Tensor  # [B] int32 the batch's indices, longest context first
    num_splits: int
    static: bool = False  # views of the CUDA-graph buffers: use the backend's static workspace
    # eager: flat part_out, part_lse, made by the first layer, grown by a layer of more heads * dim
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass
class TritonPrefillMetadata(BaseAttnMetadata):
    rows: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor  # [B] int32
    cu_seqlens: torch.Tensor  # [B+1] int32 offsets of each request's new tokens
    max_extend: int
    max_seq_len: int
    no_prefix: bool  # every request starts at position 0 (FlashAttention may skip the pool)
    num_tokens: int  # the requests' new tokens; rows past them are padding (``pad_tokens``)


@dataclass
class TritonMixedMetadata(BaseAttnMetadata):
    """Decode rows (tokens ``[0, num_decode)``) through the split-K decode kernel, which reads each
    KV head once for its whole GQA group; prefill chunks (the rest) through the extend kernel."""

    decode: TritonDecodeMetadata
    prefill: TritonPrefillMetadata
    num_decode: int


class TritonBackend(BaseAttnBackend):
    supports_cuda_graph = True
    graph_metadata_rows = 3  # rows, seq_lens, order
    supports_padding = True  # the extend kernel reads the tokens of cu_seqlens only
    # mixed batches: decode rows through the decode kernel (True) or the extend kernel (False);
    # benchmark/kernels/bench_mixed_attention.py measures both
    mixed_decode_kernel = True
    supports_window = supports_sinks = True  # soft-capping: not in the kernels
    supports_image_blocks = True  # the extend kernel's key limits

    def __init__(self, kv_pool: BaseKVCachePool, page_table: torch.Tensor) -> None:
        self.kv_pool, self.page_table = kv_pool, page_table
        self.device = page_table.device
        self.num_kv_heads = kv_pool.num_kv_heads
        self.max_seq_len = page_table.shape[1]
        self.dummy_row = page_table.shape[0] - 1
        self.num_sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda" else 16
        )
        self._graph_max_bs = 0
        self._graph_ws: tuple[torch.Tensor, torch.Tensor] | None = None  # flat part_out, part_lse
        self._max_heads_dim = 0  # the largest qo_heads * head_dim of the model's layers

    def check_layers(self, specs: list[AttentionSpec]) -> None:
        super().check_layers(specs)
        self._max_heads_dim = max((s.num_qo_heads * s.head_dim for s in specs), default=0)

    def num_splits(self, batch_size: int) -> int:
        return choose_num_splits(batch_size, self.num_kv_heads, self.max_seq_len, self.num_sms)

    # -- metadata -----------------------------------------------------------------------------

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.feeds
        if batch.is_decode:
            batch.attn_metadata = self._decode_metadata(reqs)
            return
        d = batch.num_decode_rows if self.mixed_decode_kernel else 0
        if d == 0:
            batch.attn_metadata = self._prefill_metadata(reqs)
            return
        batch.attn_metadata = TritonMixedMetadata(
            self._decode_metadata(reqs[:d]), self._prefill_metadata(reqs[d:]), d)

    def _decode_metadata(self, reqs: list) -> TritonDecodeMetadata:
        rows, seq_lens, order = to_device(_decode_lists(reqs), torch.int32, self.device)
        return TritonDecodeMetadata(rows, seq_lens, order, self.num_splits(len(reqs)))

    def _prefill_metadata(self, reqs: list) -> TritonPrefillMetadata:
        extend = [r.extend_len for r in reqs]
        cu = [0]
        for e in extend:
            cu.append(cu[-1] + e)
        rows, seq_lens, cu_seqlens = to_device(
            [[r.table_idx for r in reqs], [r.device_len for r in reqs], cu], torch.int32,
            self.device)
        return TritonPrefillMetadata(
            rows=rows, seq_lens=seq_lens, cu_seqlens=cu_seqlens,
            max_extend=max(extend), max_seq_len=max(r.device_len for r in reqs),
            no_prefix=all(r.cached_len == 0 for r in reqs), num_tokens=cu[-1],
        )

    # -- forward ------------------------------------------------------------------------------

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
        batch: Batch, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        meta = batch.attn_metadata
        if isinstance(meta, TritonDecodeMetadata):
            return self._decode(q, spec, meta, out)
        if isinstance(meta, TritonMixedMetadata):
            out = torch.empty_like(q) if out is None else out
            d = meta.num_decode
            self._decode(q[:d], spec, meta.decode, out[:d])
            self._extend(q[d:], spec, meta.prefill, out[d:], _limits(batch, spec, d))
            return out
        assert isinstance(meta, TritonPrefillMetadata), "prepare_metadata was not called"
        return self._extend(q, spec, meta, out, _limits(batch, spec, 0))

    def _decode(self, q, spec: AttentionSpec, meta: TritonDecodeMetadata, out) -> torch.Tensor:
        pool, layer = self.kv_pool, spec.kv_layer
        return decode_attention(
            q, pool.k_cache(layer), pool.v_cache(layer), self.table_for(spec), meta.rows,
            meta.seq_lens, spec.scale, meta.num_splits, out=out,
            workspace=self._workspace(meta, q), kv_scales=pool.kv_scales(layer),
            order=meta.order, pdl=self.pdl, window=spec.window, sinks=spec.sinks,
        )

    def _extend(self, q, spec: AttentionSpec, meta: TritonPrefillMetadata, out,
                key_limits: torch.Tensor | None = None) -> torch.Tensor:
        pool, layer = self.kv_pool, spec.kv_layer
        out = extend_attention(
            q, pool.k_cache(layer), pool.v_cache(layer), self.table_for(spec), meta.rows,
            meta.cu_seqlens, meta.seq_lens, meta.max_extend, spec.scale, out=out,
            kv_scales=pool.kv_scales(layer), window=spec.window, sinks=spec.sinks,
            key_limits=key_limits,
        )
        if q.shape[0] > meta.num_tokens:  # padding rows: zeros, never stale memory (a NaN
            out[meta.num_tokens:].zero_()  # there would reach the MoE router)
        return out

    def _workspace(self, meta: TritonDecodeMetadata, q: torch.Tensor):
        """Split workspace shared by all layers of one forward (none when ``num_splits == 1``),
        flat buffers viewed per layer, so layers of different heads or head sizes share it."""
        if meta.num_splits == 1:
            return None
        bs, hq, dim = q.shape
        s = meta.num_splits
        if not meta.static:
            if meta.workspace is None or meta.workspace[0].numel() < bs * hq * s * dim:
                width = max(hq * dim, self._max_heads_dim)
                meta.workspace = (
                    torch.empty(bs * s * width, dtype=torch.float32, device=q.device),
                    torch.empty(bs * s * width, dtype=torch.float32, device=q.device),
                )
            part_out, part_lse = meta.workspace
            return (part_out[: bs * hq * s * dim].view(bs, hq, s, dim),
                    part_lse[: bs * hq * s].view(bs, hq, s))
        assert self._graph_max_bs, "init_cuda_graph was not called"
        if self._graph_ws is None:  # sized once for every capturable batch size and layer
            max_bs = self._graph_max_bs
            most = max(b * self.num_splits(b) for b in range(1, max_bs + 1))
            width = max(hq * dim, self._max_heads_dim)
            self._graph_ws = (
                torch.empty(most * width, dtype=torch.float32, device=q.device),
                torch.empty(most * width, dtype=torch.float32, device=q.device),
            )
        part_out, part_lse = self._graph_ws
        return (part_out[: bs * hq * s * dim].view(bs, hq, s, dim),
                part_lse[: bs * hq * s].view(bs, hq, s))

    # -- CUDA graphs ----------------------------------------------------------------------------

    def init_cuda_graph(self, max_bs: int) -> None:
        self._graph_max_bs = max_bs
        self._graph_ws = None

    def prepare_for_capture(self, batch: Batch, bufs: torch.Tensor) -> None:
        bs = batch.size
        assert bs <= self._graph_max_bs, f"batch of {bs} > max_bs {self._graph_max_bs}"
        assert bufs.shape == (self.graph_metadata_rows, bs) and bufs.dtype == torch.int32
        batch.attn_metadata = TritonDecodeMetadata(bufs[0], bufs[1], bufs[2], self.num_splits(bs),
                                                   static=True)

    def replay_metadata(self, batch: Batch, padded_bs: int) -> list[list[int]]:
        n, pad = batch.size, padded_bs - batch.size
        rows, lens, order = _decode_lists(batch.feeds)
        return [rows + [self.dummy_row] * pad, lens + [1] * pad, order + list(range(n, padded_bs))]
