"""The reference backend: gather each request's pages, pad the batch, one masked SDPA call.

It runs on any device and is what the GPU kernels are checked against; it is not fast. A plain
layer is one SDPA call; a layer with sinks or a soft-cap takes the explicit softmax
(``attend``), a sliding window narrows the mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .base import AttentionSpec, BaseAttnBackend, BaseAttnMetadata

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache import BaseKVCachePool


@dataclass
class TorchAttnMetadata(BaseAttnMetadata):
    slots: torch.Tensor  # [B, max_seq] KV slot of every context position (padding reads slot 0)
    window_slots: torch.Tensor | None  # the same in the sliding layers' own slot space, if any
    mask: torch.Tensor  # [B, 1, max_extend, max_seq] True where a query may attend
    token_index: torch.Tensor  # [T] position of each packed token in the [B * max_extend] padding
    distance: torch.Tensor  # [B, 1, max_extend, max_seq] query position - key position
    windowed: dict[tuple, torch.Tensor] = field(default_factory=dict)  # (window, ...) -> mask
    # the mask whose image tokens see their whole image (``AttentionSpec.image_blocks``)
    image_mask: torch.Tensor | None = None

    def mask_for(self, window: int | None, image_blocks: bool = False) -> torch.Tensor:
        """The causal mask (with image blocks when asked and the batch has them), narrowed to
        the last ``window`` keys of each query when given."""
        blocks = image_blocks and self.image_mask is not None
        mask = self.image_mask if blocks else self.mask
        assert mask is not None
        if window is None:
            return mask
        if (window, blocks) not in self.windowed:
            self.windowed[(window, blocks)] = mask & (self.distance < window)
        return self.windowed[(window, blocks)]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           spec: AttentionSpec) -> torch.Tensor:
    """Explicit attention ``[B, Hq, M, D]`` x ``[B, Hkv, S, D]`` in float32: soft-capped scores,
    and the sinks as one more logit per head in the denominator (no value)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    s = torch.matmul(q.float(), k.transpose(-1, -2)) * spec.scale
    if spec.logit_softcap is not None:
        s = torch.tanh(s / spec.logit_softcap) * spec.logit_softcap
    s = s.masked_fill(~mask, float("-inf"))
    if spec.sinks is not None:
        sink = spec.sinks.float().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        p = torch.cat([s, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        p = s.softmax(-1)
    return torch.matmul(p.nan_to_num(0.0), v).to(q.dtype)


class TorchBackend(BaseAttnBackend):
    supports_window = supports_sinks = supports_softcap = supports_image_blocks = True

    def __init__(self, kv_pool: BaseKVCachePool, page_table: torch.Tensor) -> None:
        self.kv_pool, self.page_table = kv_pool, page_table

    def prepare_metadata(self, batch: Batch) -> None:
        reqs = batch.feeds
        device = self.page_table.device
        seq = torch.tensor([r.device_len for r in reqs])
        cached = torch.tensor([r.cached_len for r in reqs])
        extend = seq - cached
        max_seq, max_ext = int(seq.max()), int(extend.max())
        rows = torch.tensor([r.table_idx for r in reqs], device=device)
        slots = self.page_table[rows, :max_seq].long()
        # positions before a window hold stale slots (their pages freed): read, then masked
        window_slots = (None if self.window_page_table is None
                        else self.window_page_table[rows, :max_seq].long())
        key_pos = torch.arange(max_seq)
        q_pos = cached[:, None] + torch.arange(max_ext)[None, :]  # [B, max_ext]
        mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & (key_pos < seq[:, None, None])
        token_index = torch.cat(
            [b * max_ext + torch.arange(n) for b, n in enumerate(extend.tolist())]
        )
        distance = (q_pos[:, :, None] - key_pos[None, None, :]).unsqueeze(1)
        image_mask = None
        if batch.images is not None and batch.images.key_limits is not None:
            limits = torch.zeros(len(reqs) * max_ext, dtype=torch.long)
            limits[token_index] = batch.images.key_limits[:len(token_index)].cpu().long()
            limits = limits.view(len(reqs), max_ext)
            image_mask = ((key_pos[None, None, :] <= limits[:, :, None])
                          & (key_pos < seq[:, None, None])).unsqueeze(1).to(device)
        batch.attn_metadata = TorchAttnMetadata(
            slots=slots, window_slots=window_slots, mask=mask.unsqueeze(1).to(device),
            token_index=token_index.to(device),
            distance=distance.to(device), image_mask=image_mask,
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
        batch: Batch, out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        meta: TorchAttnMetadata = batch.attn_metadata  # type: ignore[assignment]
        num_reqs, max_ext = meta.mask.shape[0], meta.mask.shape[2]
        q_pad = q.new_zeros(num_reqs * max_ext, *q.shape[1:])
        q_pad[meta.token_index] = q
        q_pad = q_pad.view(num_reqs, max_ext, *q.shape[1:]).transpose(1, 2)
        slots = meta.slots
        if spec.sliding_window is not None and meta.window_slots is not None:
            slots = meta.window_slots
        k_ctx, v_ctx = self.kv_pool.read_kv(spec.kv_layer, slots, q.dtype)
        k_ctx, v_ctx = k_ctx.transpose(1, 2), v_ctx.transpose(1, 2)
        mask = meta.mask_for(spec.sliding_window, spec.image_blocks)
        if spec.sinks is None and spec.logit_softcap is None:
            res = F.scaled_dot_product_attention(
                q_pad, k_ctx, v_ctx, attn_mask=mask, scale=spec.scale,
                enable_gqa=q.shape[1] != k_ctx.shape[1],
            )
        else:
            res = attend(q_pad, k_ctx, v_ctx, mask, spec)
        res = res.transpose(1, 2).reshape(num_reqs * max_ext, *q.shape[1:])[meta.token_index]
        return res if out is None else out.copy_(res)
