"""The contract of a linear-attention backend."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache.state_pool import StatePool


class BaseLinearAttnBackend(ABC):
    """Runs the token mixer of Gated DeltaNet layers (causal conv, then the gated delta rule) over
    the state pool.

    ``forward`` gets a layer's projections of the batch's tokens and ``batch.state_metadata``
    (``kvcache/state_metadata.py``); it reads and updates the requests' slots in place, in stream
    order, and returns the mixer's output. Tokens past the metadata's belong to no request: their
    rows are zeros and they touch no slot. Backends that can be captured in a CUDA graph set
    ``supports_cuda_graph`` (their decode path syncs nothing with the host and allocates no
    host-dependent shapes)."""

    supports_cuda_graph = False

    def __init__(self, state_pool: StatePool) -> None:
        self.state_pool = state_pool

    @abstractmethod
    def forward(self, layer: torch.nn.Module, qkv: torch.Tensor, a: torch.Tensor,
                b: torch.Tensor, batch: Batch,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """``layer``: a ``layers.linear_attention.GatedDeltaNet`` (its weights, head counts and
        ``state_index``); qkv ``[T, conv_dim]`` (conv input: q | k | v heads), a, b ``[T, HV]``
        (gating inputs). Returns ``[T, HV, V]`` in qkv's dtype (into ``out`` when given)."""
