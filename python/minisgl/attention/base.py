"""The attention backend interface.

A backend owns how attention reads the paged KV pool. The engine calls ``prepare_metadata(batch)``
once per forward, before the model runs (host-side work, and host-to-device copies); every attention
layer then calls ``forward(q, k, v, layer_id, batch)``, which must first store this step's K/V at
``batch.out_loc`` and then attend over each request's whole context ``[0, device_len)``, causally for
the new tokens (token ``i`` of a request sits at position ``cached_len + i``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.core import Batch


class BaseAttnMetadata:
    """Whatever tensors a backend derives from the batch (lengths, page-table rows, ...)."""


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Fill ``batch.attn_metadata``."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """q: [T, qo_heads, head_dim], k/v: [T, kv_heads, head_dim] -> [T, qo_heads, head_dim]."""
