"""The gated full attention of hybrid decoders (Qwen3-Next, Qwen3.5, Qwen3.6) and its norms; the
linear attention between these layers is ``linear_attention.py``.

Norm convention: every RMSNorm of these checkpoints but the gated one scales by ``1 + weight``
(weights are stored centred on zero: ``RMSNorm(offset=1.0)``), computed in fp32 and cast once, as
the reference does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.attention.spec import AttentionSpec
from minisgl.distributed import DistributedCommunicator

from .base import divide
from .linear import LinearQKVMerged, LinearRowParallel
from .norm import RMSNorm
from .rotary import RotaryEmbedding, cos_sin_cache

if TYPE_CHECKING:
    from minisgl.context import Context
    from minisgl.models.config import ModelConfig, RotaryConfig


class GatedAttention(nn.Module):
    """Full attention with an output gate: q_proj gives each head's query and gate side by side;
    q/k get (1 + w) RMSNorm and partial RoPE; the output is ``o_proj(attn * sigmoid(gate))``.

    ``kv_layer``: this layer's index among the full-attention layers (the KV pool holds only them).
    """

    def __init__(self, cfg: ModelConfig, rotary: RotaryConfig, kv_layer: int,
                 comm: DistributedCommunicator) -> None:
        super().__init__()
        self.kv_layer, self.head_dim = kv_layer, cfg.head_dim
        self.rotary = RotaryEmbedding(rotary)
        divide(cfg.num_qo_heads, comm.info.size, "num_attention_heads")
        # each head's [query | gate] rows are adjacent: 2 * heads rows of head_dim, split evenly
        self.qkv_proj = LinearQKVMerged(cfg.hidden_size, cfg.head_dim, 2 * cfg.num_qo_heads,
                                        cfg.num_kv_heads, cfg.attention_bias, comm.info,
                                        cfg.quant)
        self.local_qo = self.qkv_proj.local_qo // 2
        self.o_proj = LinearRowParallel(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, False,
                                        comm, cfg.quant)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, offset=1.0)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, offset=1.0)
        self.spec = AttentionSpec(kv_layer, self.local_qo, self.qkv_proj.local_kv, cfg.head_dim,
                                  cfg.head_dim**-0.5, rotary=rotary)

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """(q ``[T, H, D]``, k, v ``[T, Hkv, D]`` normed and rotated, gate ``[T, H * D]``): what
        the attention takes (the MTP head, ``models/mtp.py``, attends over its own KV)."""
        proj = self.qkv_proj
        q_gate, k, v = proj(x).split([proj.q_size, proj.kv_size, proj.kv_size], dim=-1)
        q, gate = q_gate.view(-1, self.local_qo, 2 * self.head_dim).chunk(2, dim=-1)
        gate = gate.reshape(x.shape[0], -1)
        k = k.view(-1, proj.local_kv, self.head_dim)
        if x.is_cuda:  # norms and RoPE in one launch
            from minisgl.kernel.triton.partial_rope import qk_norm_partial_rope

            cos, sin = cos_sin_cache(self.rotary.cfg, x.device).chunk(2, dim=-1)
            q, k = qk_norm_partial_rope(q, k, positions, cos, sin, self.q_norm.weight,
                                        self.k_norm.weight, self.q_norm.eps)
        else:
            q, k = self.rotary(positions, self.q_norm(q), self.k_norm(k))
        v = v.reshape(-1, proj.local_kv, self.head_dim).contiguous()
        return q, k, v, gate

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        q, k, v, gate = self.project(x, positions)
        ctx.kv_pool.store_kv(k, v, ctx.batch.out_loc, self.kv_layer)
        out = ctx.attn_backend.forward(q, k, v, self.spec, ctx.batch)
        out = out.reshape(x.shape[0], -1) * torch.sigmoid(gate)
        return self.o_proj(out)
