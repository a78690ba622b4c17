"""Self-attention of one decoder layer: merged QKV, optional per-head q/k (and v) norms, RoPE, the
K/V store into the paged pool, the attention backend over it, optionally an output gate, and the
row-parallel output projection. On CUDA two variants run fused Triton kernels: q/k norms (any
with a weight, and Gemma 4's weightless v norm) with RoPE over the whole head (norms, RoPE and the
store in one kernel, ``kernel/triton/rotary.py``), and ``(1 + w)`` norms with partial RoPE (the
hybrid models' gated attention: norms and RoPE in one, ``kernel/triton/partial_rope.py``).

The layer carries its ``AttentionSpec`` (``kvcache/spec.py``): head size, KV heads, scale,
sliding window, sinks and soft-cap are arguments, defaulting to the model config's, so a family
with local and global layers builds each with its own and no backend learns about the family."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.kvcache.spec import AttentionSpec

from .base import copy_weight, new_param, shard
from .linear import LinearQKVMerged, LinearRowParallel
from .norm import RMSNorm
from .rotary import RotaryEmbedding, pow2

if TYPE_CHECKING:
    from minisgl.context import Context
    from minisgl.models.config import ModelConfig


class AttentionLayer(nn.Module):
    """``kv_layer``: the pool layer (default ``layer_id``); ``head_dim``/``num_kv_heads``/``scale``
    override the config's (``scale`` defaults to ``head_dim ** -0.5``); ``sliding_window``: None or
    W; ``sinks``: learn one logit per query head (parameter ``sinks``, loaded per rank);
    ``rotary``: the layer's RoPE (default: the config's); ``norm``: makes the q/k norms,
    ``norm(head_dim, eps)`` (default: ``RMSNorm`` when the config has q/k norms, else none;
    ``functools.partial(RMSNorm, offset=1.0)`` for another variant); ``v_norm``: the same for v
    (Gemma 4), none by default; ``gate`` (the hybrid models' gated attention): q_proj gives each
    head's query and an output gate side by side, and the output is ``o_proj(attn *
    sigmoid(gate))``."""

    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def __init__(self, cfg: ModelConfig, layer_id: int, comm: DistributedCommunicator, *,
                 kv_layer: int | None = None, head_dim: int | None = None,
                 num_kv_heads: int | None = None, scale: float | None = None,
                 sliding_window: int | None = None, sinks: bool = False,
                 logit_softcap: float | None = None, rotary: RotaryEmbedding | None = None,
                 norm: Callable[[int, float], RMSNorm] | None = None,
                 v_norm: Callable[[int, float], RMSNorm] | None = None,
                 gate: bool = False) -> None:
        super().__init__()
        head_dim = head_dim or cfg.head_dim
        self.layer_id, self.head_dim, self.gated = layer_id, head_dim, gate
        # gated: each head's [query | gate] rows are adjacent, 2 * heads rows of head_dim
        rows = 2 if gate else 1
        self.qkv_proj = LinearQKVMerged(
            cfg.hidden_size, head_dim, rows * cfg.num_qo_heads, num_kv_heads or cfg.num_kv_heads,
            cfg.attention_bias, comm.info, cfg.quant,
        )
        self.local_qo = self.qkv_proj.local_qo // rows
        self.o_proj = LinearRowParallel(
            cfg.num_qo_heads * head_dim, cfg.hidden_size, False, comm, cfg.quant
        )
        if norm is None and cfg.qk_norm:
            norm = RMSNorm
        self.q_norm = norm(head_dim, cfg.rms_norm_eps) if norm is not None else None
        self.k_norm = norm(head_dim, cfg.rms_norm_eps) if norm is not None else None
        self.v_norm = v_norm(head_dim, cfg.rms_norm_eps) if v_norm is not None else None
        self.rotary = rotary if rotary is not None else RotaryEmbedding(cfg.rotary)
        self.tp = comm.info
        self.sinks = new_param(self.local_qo, loader=self._load_sinks,
                               dtype=torch.float32) if sinks else None
        self.spec = AttentionSpec(
            kv_layer=layer_id if kv_layer is None else kv_layer, num_qo_heads=self.local_qo,
            num_kv_heads=self.qkv_proj.local_kv, head_dim=head_dim,
            scale=scale if scale is not None else head_dim**-0.5, sliding_window=sliding_window,
            sinks=self.sinks, logit_softcap=logit_softcap, rotary=self.rotary.cfg,
        )
        # which fused CUDA kernel computes this layer's norms and RoPE (see the module docstring)
        rot = self.rotary.cfg.head_dim
        fusable = type(self.rotary) is RotaryEmbedding and pow2(head_dim)
        self._fused_store = (fusable and rot == head_dim
                             and (self.q_norm is None or self.q_norm.weight is not None)
                             and (self.v_norm is None or self.v_norm.weight is None))
        self._fused_partial = (fusable and rot < head_dim and pow2(rot) and self.v_norm is None
                               and self.q_norm is not None and self.q_norm.offset == 1.0)

    def _load_sinks(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: object) -> None:
        copy_weight(param, shard(loaded, 0, self.tp))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: Context,
                norm_eps: float | None = None,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """``norm_eps``: x is RMS-normalised inside the QKV projection (its norm weight folded in);
        ``residual``: added by the output projection (see ``DecoderLayer._forward_one_token``)."""
        q, k, v, gate = self._split(self.qkv_proj(x, norm_eps))
        q, k, v = self._norm_rope_store(q, k, v, positions, ctx)
        out = ctx.attn_backend.forward(q, k, v, self.spec, ctx.batch).reshape(x.shape[0], -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out, residual=residual)

    def _split(self, qkv: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        proj, d = self.qkv_proj, self.head_dim
        q, k, v = qkv.split([proj.q_size, proj.kv_size, proj.kv_size], dim=-1)
        gate = None
        if self.gated:
            q, gate = q.view(-1, self.local_qo, 2 * d).chunk(2, dim=-1)
            gate = gate.reshape(q.shape[0], -1)
        else:
            q = q.view(-1, self.local_qo, d)
        return q, k.view(-1, proj.local_kv, d), v.view(-1, proj.local_kv, d), gate

    def _norm_rope_store(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
        ctx: Context,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q/k norms and RoPE, then this step's K/V into the pool at ``batch.out_loc``."""
        pool, out_loc, layer = ctx.kv_pool, self.spec.out_loc(ctx.batch), self.spec.kv_layer
        if (q.is_cuda and self._fused_store
                and pool.dtype in (q.dtype, torch.float8_e4m3fn)):
            from minisgl.kernel.triton.rotary import norm_rope_store_

            qn, kn = self.q_norm, self.k_norm
            qw = kw = None
            eps, fp32, offset = 0.0, False, False
            if qn is not None and kn is not None:
                qw, kw, eps, fp32, offset = qn.weight, kn.weight, qn.eps, qn.fp32, qn.offset != 0
            table, rows = self.rotary.table(positions, q.device)
            norm_rope_store_(rows, q, k, v, table, pool.k_cache(layer), pool.v_cache(layer),
                             out_loc, qw, kw, eps, pool.kv_scales(layer), pdl=self.pdl,
                             fp32_norm=fp32, offset=offset,
                             v_norm_eps=None if self.v_norm is None else self.v_norm.eps)
            return q, k, v
        q, k, v = self._norm_rope(q, k, v, positions)
        pool.store_kv(k, v, out_loc, layer)
        return q, k, v

    def _norm_rope(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if q.is_cuda and self._fused_partial:
            from minisgl.kernel.triton.partial_rope import qk_norm_partial_rope

            assert self.q_norm is not None and self.k_norm is not None
            table, rows = self.rotary.table(positions, q.device)
            cos, sin = table.chunk(2, dim=-1)
            q, k = qk_norm_partial_rope(q, k, rows, cos, sin, self.q_norm.weight,
                                        self.k_norm.weight, self.q_norm.eps)
            return q, k, v
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        q, k = self.rotary(positions, q, k)
        return q, k, v
