"""Self-attention of one decoder layer: merged QKV, optional per-head q/k RMSNorm (Qwen3), RoPE,
the K/V store into the paged pool, the attention backend over it, and the row-parallel output
projection. On CUDA the norms, RoPE and the store are one Triton kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator

from .linear import LinearQKVMerged, LinearRowParallel
from .norm import RMSNorm
from .rotary import RotaryEmbedding, cos_sin_cache, pow2

if TYPE_CHECKING:
    from minisgl.context import Context
    from minisgl.models.config import ModelConfig


class AttentionLayer(nn.Module):
    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

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
            cfg.quant,
        )
        self.o_proj = LinearRowParallel(
            cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, False, comm, cfg.quant
        )
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = RotaryEmbedding(cfg.rotary)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: Context,
                norm_eps: float | None = None,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """``norm_eps``: x is RMS-normalised inside the QKV projection (its norm weight folded in);
        ``residual``: added by the output projection (see ``DecoderLayer._forward_one_token``)."""
        proj = self.qkv_proj
        qkv = self.qkv_proj(x, norm_eps)
        q, k, v = qkv.split([proj.q_size, proj.kv_size, proj.kv_size], dim=-1)
        q = q.view(-1, proj.local_qo, self.head_dim)
        k = k.view(-1, proj.local_kv, self.head_dim)
        v = v.view(-1, proj.local_kv, self.head_dim)
        q, k = self._norm_rope_store(q, k, v, positions, ctx)
        out = ctx.attn_backend.forward(q, k, v, self.layer_id, ctx.batch)
        return self.o_proj(out.reshape(out.shape[0], -1), residual=residual)

    def _norm_rope_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
        ctx: Context,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q/k norms and RoPE, then this step's K/V into the pool at ``batch.out_loc``."""
        pool, out_loc = ctx.kv_pool, ctx.batch.out_loc
        if q.is_cuda and pow2(self.head_dim) and pool.dtype in (q.dtype, torch.float8_e4m3fn):
            from minisgl.kernel.triton.rotary import norm_rope_store_

            qw = self.q_norm.weight if self.q_norm is not None else None
            kw = self.k_norm.weight if self.k_norm is not None else None
            eps = self.q_norm.eps if self.q_norm is not None else 0.0
            norm_rope_store_(positions, q, k, v, cos_sin_cache(self.rotary.cfg, q.device),
                             pool.k_cache(self.layer_id), pool.v_cache(self.layer_id), out_loc,
                             qw, kw, eps, pool.kv_scales(self.layer_id), pdl=self.pdl)
            return q, k
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        pool.store_kv(k, v, out_loc, self.layer_id)
        return q, k
