"""Qwen3-Next (``Qwen3NextForCausalLM``): the hybrid decoder of ``hybrid.py`` (three Gated DeltaNet
layers for each gated full-attention layer), its linear-attention projections fused per key head.
"""

from __future__ import annotations

import torch

from minisgl.distributed import DistributedCommunicator
from minisgl.layers.linear_attention import GatedDeltaNet, SplitColumnLinear

from .hybrid import HybridModel


class Qwen3NextGatedDeltaNet(GatedDeltaNet):
    """Fused projections laid out per key head: ``in_proj_qkvz`` rows are, for each key head, its
    q, k, the v of its value heads and their z; ``in_proj_ba`` likewise b then a. A rank's key
    heads are consecutive rows, so each is one part split evenly."""

    def __init__(self, cfg, hidden_size: int, eps: float, state_index: int,
                 comm: DistributedCommunicator, quant) -> None:
        super().__init__(cfg, hidden_size, eps, state_index, comm, quant)
        hk, rep = cfg.num_key_heads, self.num_v_heads // self.num_k_heads
        group = 2 * self.k_dim + 2 * rep * self.v_dim
        self.in_proj_qkvz = SplitColumnLinear(hidden_size, [hk * group], comm, quant)
        self.in_proj_ba = SplitColumnLinear(hidden_size, [hk * 2 * rep], comm)
        self.rep = rep

    def project(self, x: torch.Tensor):
        t, r = x.shape[0], self.rep
        qkvz = self.in_proj_qkvz(x).view(t, self.num_k_heads, -1)
        q, k, v, z = qkvz.split([self.k_dim, self.k_dim, r * self.v_dim, r * self.v_dim], dim=-1)
        qkv = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        b, a = self.in_proj_ba(x).view(t, self.num_k_heads, 2 * r).split([r, r], dim=-1)
        return (qkv, z.reshape(t, self.num_v_heads, self.v_dim), b.reshape(t, -1),
                a.reshape(t, -1))


class Qwen3NextForCausalLM(HybridModel):
    linear_cls = Qwen3NextGatedDeltaNet
