"""Self-attention of one decoder layer: merged QKV, optional per-head q/k RMSNorm (Qwen3), RoPE,
the attention backend over the paged KV pool, and the row-parallel output projection."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator

from .linear import LinearQKVMerged, LinearRowParallel
from .norm import RMSNorm
from .rotary import RotaryEmbedding

if TYPE_CHECKING:
    from minisgl.core import Context
    from minisgl.models.config import ModelConfig


class AttentionLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, comm: DistributedCommunicator) -> None:
        super().__init__()
        self.layer_id, self.head_dim = layer_id, cfg.head_dim
        self.qkv_proj = LinearQKVMerged(
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.attention_bias,
            comm.info,
        )
        self.o_proj = LinearRowParallel(
            cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, False, comm
        )
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = RotaryEmbedding(cfg.rotary)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        proj = self.qkv_proj
        q, k, v = self.qkv_proj(x).split([proj.q_size, proj.kv_size, proj.kv_size], dim=-1)
        q = q.view(-1, proj.local_qo, self.head_dim)
        k = k.view(-1, proj.local_kv, self.head_dim)
        v = v.view(-1, proj.local_kv, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        out = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
        return self.o_proj(out.reshape(out.shape[0], -1))
