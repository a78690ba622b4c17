"""The forward context: what the layers need during one forward (attention backend, KV pool, page
table) and the batch, bound only inside a scope."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:
    from minisgl.attention.base import BaseAttnBackend
    from minisgl.core import Batch
    from minisgl.kvcache.base import BaseKVCachePool
    from minisgl.kvcache.state_pool import StatePool
    from minisgl.linear_attn import BaseLinearAttnBackend


class Context:
    """What the layers need during one forward: the attention backend, the KV pool (and a hybrid
    model's state pool and linear-attention backend) and the batch.

    The batch is bound only inside ``with ctx.forward_batch(batch):``; nesting is an error and the
    binding is always cleared, so no layer can see a stale batch.
    """

    def __init__(
        self,
        page_table: torch.Tensor,
        kv_pool: BaseKVCachePool,
        attn_backend: BaseAttnBackend,
        state_pool: StatePool | None = None,
        linear_attn: BaseLinearAttnBackend | None = None,
    ) -> None:
        self.page_table = page_table
        self.kv_pool = kv_pool
        self.attn_backend = attn_backend
        self.state_pool = state_pool  # hybrid models: the linear layers' recurrent state
        self.linear_attn = linear_attn  # ... and the backend that reads and writes it
        self._batch: Batch | None = None

    @property
    def batch(self) -> Batch:
        assert self._batch is not None, "no batch is bound: use `with ctx.forward_batch(batch)`"
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[Batch]:
        assert self._batch is None, "forward_batch cannot be nested"
        self._batch = batch
        try:
            yield batch
        finally:
            self._batch = None
