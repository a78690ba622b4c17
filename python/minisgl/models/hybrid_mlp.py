"""The MLPs of the hybrid decoders' layers (``hybrid.py``) and of their MTP head (``mtp.py``): a
dense gated MLP, or routed experts beside a gated shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import GatedMLP, MoELayer
from minisgl.layers.base import new_param
from minisgl.moe import BaseMoeBackend

from .config import ModelConfig


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
