"""The attention backend interface.

A backend owns how attention reads the paged KV pool. The engine calls ``prepare_metadata(batch)``
once per forward, before the model runs (host-side work, and host-to-device copies); every
attention layer stores this step's K/V at ``batch.out_loc`` and then calls
``forward(q, k, v, spec, batch)``, which attends over each request's whole context
``[0, device_len)`` in the pool, causally for the new tokens (token ``i`` of a request sits at
position ``cached_len + i``). ``k``/``v`` are this step's rows too, for backends that can attend
without reading them back (no cached prefix).

``spec`` is the layer's ``AttentionSpec`` (``kvcache/spec.py``): its KV layer, scale, sliding
window, sinks and soft-cap. ``check_layers(specs)`` is called once at start-up with every layer's
spec: a backend refuses there what it cannot compute (``supports_*``).

CUDA graphs (decode only). A backend that can be captured sets ``supports_cuda_graph = True``,
``graph_metadata_rows`` and implements three methods; the graph runner calls them in this order::

    init_cuda_graph(max_bs)          once: static state for up to max_bs requests
    for bs in captured sizes:        (largest first)
        prepare_for_capture(batch, bufs)
                                     batch: bs dummy requests; bufs: int32 [graph_metadata_rows, bs]
                                     on the device, holding replay_metadata(batch, bs); sets
                                     batch.attn_metadata to views of bufs, then model.forward is
                                     warmed up + captured
    per step:
        replay_metadata(batch, padded_bs)
                                     the live batch's rows of bufs, as host lists, which the runner
                                     copies with its own inputs in one transfer; rows batch.size ..
                                     padded_bs-1 are the dummy request (the page table's last row,
                                     context length 1)
        plan_replay(batch, padded_bs)
                                     host work the replay needs besides bufs (FlashInfer's plan);
                                     a no-op for backends whose kernels read everything from bufs

Everything a captured forward reads (lengths, page-table rows, split workspace) must therefore live
in ``bufs`` or in buffers the backend owns, and no launch may depend on device data (grids from
host-side bounds).

Prefill and mixed forwards replay piecewise graphs instead (``engine/piecewise.py``) when the
backend accepts padding rows: ``forward`` itself is never captured there, but called eagerly between
the graphs, with the batch's own metadata, static q/k/v buffers and ``out=`` the static output
buffer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Iterable

import torch

from minisgl.core import BaseAttnMetadata
from minisgl.kvcache.spec import AttentionSpec

if TYPE_CHECKING:
    from minisgl.core import Batch

__all__ = ["AttentionSpec", "BaseAttnBackend", "BaseAttnMetadata"]


class BaseAttnBackend(ABC):
    supports_cuda_graph: bool = False
    graph_metadata_rows: int = 0  # int32 rows of a captured decode step's metadata
    # prefill and mixed batches may carry padding tokens after the last request's (engine/batch.py):
    # rows of q that no request's metadata covers, whose output nobody reads
    supports_padding: bool = False
    # decode kernels launch with PDL (``kernel/triton/pdl.py``); set by the engine
    pdl: bool = False
    # what the backend computes beyond plain causal attention (``AttentionSpec``)
    supports_window: bool = False
    supports_sinks: bool = False
    supports_softcap: bool = False
    # image blocks (``AttentionSpec.image_blocks``): checked per request with images, since a
    # model that needs them serves text on any backend
    supports_image_blocks: bool = False
    page_table: torch.Tensor
    # the sliding layers' own page table, when the engine frees their pages past the window
    window_page_table: torch.Tensor | None = None

    def set_window_page_table(self, table: torch.Tensor) -> None:
        """Sliding layers read their K/V through ``table`` from now on (``table_for``)."""
        self.window_page_table = table

    def table_for(self, spec: AttentionSpec) -> torch.Tensor:
        """The page table of ``spec``'s slot space."""
        if spec.sliding_window is not None and self.window_page_table is not None:
            return self.window_page_table
        return self.page_table

    def check_layers(self, specs: list[AttentionSpec]) -> None:
        """Raise ``ValueError`` naming the feature if some layer asks for one this backend lacks."""
        check_supported(type(self).__name__, specs, window=self.supports_window,
                        sinks=self.supports_sinks, softcap=self.supports_softcap)

    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Fill ``batch.attn_metadata``."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
        batch: Batch, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q: [T, qo_heads, head_dim], k/v: [T, kv_heads, head_dim] (already in the pool)
        -> [T, qo_heads, head_dim], written into ``out`` when one is given (and returned)."""

    # -- CUDA graphs (see the module docstring); backends without them keep these defaults --------

    def init_cuda_graph(self, max_bs: int) -> None:
        """Allocate static state for decode batches of up to ``max_bs`` requests."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def prepare_for_capture(self, batch: Batch, bufs: torch.Tensor) -> None:
        """Point ``batch.attn_metadata`` (``batch.size`` dummy requests) at ``bufs`` (int32
        ``[graph_metadata_rows, batch.size]``, holding ``replay_metadata(batch, batch.size)``)."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def replay_metadata(self, batch: Batch, padded_bs: int) -> list[list[int]]:
        """The rows of the graph's ``bufs`` for ``batch``, padded to ``padded_bs`` (the dummy)."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def plan_replay(self, batch: Batch, padded_bs: int) -> None:
        """Before the graph of ``padded_bs`` replays ``batch``: what its kernels read that is not
        in ``bufs`` (``batch.out_slots``: the new tokens' slots, which the graph itself writes into
        the page table)."""

def check_supported(backend: str, specs: Iterable[AttentionSpec], *, window: bool = True,
                    sinks: bool = True, softcap: bool = True) -> None:
    """Refuse, naming the layer and the feature, a model whose layers ask for what ``backend``
    cannot compute."""
    for spec in specs:
        missing = [name for name, asked, can in (
            ("a sliding window", spec.sliding_window is not None, window),
            ("attention sinks", spec.sinks is not None, sinks),
            ("logit soft-capping", spec.logit_softcap is not None, softcap),
        ) if asked and not can]
        if missing:
            raise ValueError(f"attention backend {backend!r} does not support "
                             f"{' or '.join(missing)} (KV layer {spec.kv_layer}); "
                             f"use --attn triton on CUDA or --attn torch")
