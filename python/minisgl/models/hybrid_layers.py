"""What the hybrid decoders' layers (``hybrid.py``) and their MTP head (``mtp.py``) build beside the
shared layers: the gated full attention of these checkpoints, and routed experts beside a gated
shared expert.

Norm convention: every RMSNorm of these checkpoints but the Gated DeltaNet's gated one scales by
``1 + weight`` (weights stored centred on zero), computed in fp32 and cast once, as the reference
does: ``RMSNorm(offset=1.0)``. Rotary positions are the text positions of the checkpoints' mRoPE
(its sections all see the same position for text, so it is plain RoPE over the rotated dims).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import AttentionLayer, GatedMLP, MoELayer, RMSNorm, RotaryEmbedding
from minisgl.layers.base import new_param
from minisgl.moe import BaseMoeBackend

from .config import ModelConfig


def gated_attention(cfg: ModelConfig, layer_id: int, kv_layer: int,
                    comm: DistributedCommunicator) -> AttentionLayer:
    """Full attention with an output gate, ``(1 + w)`` q/k norms and RoPE over the first
    ``rotary_fraction`` of each head; ``kv_layer``: its index among the full-attention layers
    (the KV pool holds only them)."""
    rotary = dataclasses.replace(cfg.rotary,
                                 head_dim=int(cfg.head_dim * cfg.hybrid.rotary_fraction))
    return AttentionLayer(cfg, layer_id, comm, kv_layer=kv_layer, gate=True,
                          rotary=RotaryEmbedding(rotary),
                          norm=functools.partial(RMSNorm, offset=1.0))


class SharedExpertMoE(nn.Module):
    """Routed experts plus one shared expert scaled by ``sigmoid(shared_expert_gate(x))``."""

    def __init__(self, cfg: ModelConfig, shared_inter: int, comm: DistributedCommunicator,
                 backend: BaseMoeBackend) -> None:
        super().__init__()
        self.experts = MoELayer(cfg, comm, backend, cfg.quant)
        self.shared_expert = GatedMLP(cfg.hidden_size, shared_inter, comm, cfg.quant)
        self.shared_expert_gate = new_param(1, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(F.linear(x, self.shared_expert_gate)) * self.shared_expert(x)
        return self.experts(x) + shared
