"""The reference backend: gather each request's pages, pad the batch, one masked SDPA call.

It runs on any device and is what the GPU kernels are checked against; it is not fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .base import BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache import BaseKVCachePool


@dataclass
class TorchAttnMetadata(BaseAttnMetadata):
    slots: torch.Tensor  # [B, max_seq] KV slot of every context position (padding reads slot 0)
    mask: torch.Tensor  # [B, 1, max_extend, max_seq] True where a query may attend
    token_index: torch.Tensor  # [T] position of each packed token in the [B * max_extend] padding


class TorchBackend(BaseAttnBackend):
    def __init__(self, kv_pool: BaseKVCachePool, page_table: torch.Tensor, scale: float) -> None:
        self.kv_pool, self.page_table, self.scale = kv_pool, page_table, scale

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.reqs
        device = self.page_table.device
        seq = torch.tensor([r.device_len for r in reqs])
        cached = torch.tensor([r.cached_len for r in reqs])
        extend = seq - cached
        max_seq, max_ext = int(seq.max()), int(extend.max())
        rows = torch.tensor([r.table_idx for r in reqs], device=device)
        slots = self.page_table[rows, :max_seq].long()
        key_pos = torch.arange(max_seq)
        q_pos = cached[:, None] + torch.arange(max_ext)[None, :]  # [B, max_ext]
        mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & (key_pos < seq[:, None, None])
        token_index = torch.cat(
            [b * max_ext + torch.arange(n) for b, n in enumerate(extend.tolist())]
        )
        batch.attn_metadata = TorchAttnMetadata(
            slots=slots, mask=mask.unsqueeze(1).to(device), token_index=token_index.to(device)
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        meta: TorchAttnMetadata = batch.attn_metadata  # type: ignore[assignment]
        num_reqs, max_ext = meta.mask.shape[0], meta.mask.shape[2]
        q_pad = q.new_zeros(num_reqs * max_ext, *q.shape[1:])
        q_pad[meta.token_index] = q
        q_pad = q_pad.view(num_reqs, max_ext, *q.shape[1:]).transpose(1, 2)
        k_ctx, v_ctx = self.kv_pool.read_kv(layer_id, meta.slots, q.dtype)
        k_ctx, v_ctx = k_ctx.transpose(1, 2), v_ctx.transpose(1, 2)
        res = F.scaled_dot_product_attention(
            q_pad, k_ctx, v_ctx, attn_mask=meta.mask, scale=self.scale,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        res = res.transpose(1, 2).reshape(num_reqs * max_ext, *q.shape[1:])[meta.token_index]
        return res if out is None else out.copy_(res)
