"""Gemma 4's MoE block, beside each layer's dense MLP: a router that normalises the stream (no
weight), scales it by a learned vector and ``hidden ** -0.5``, takes the softmax's top k,
renormalises them and multiplies each by its expert's learned scale; GELU-tanh gated experts.

The experts run on the engine's MoE backend with the GELU-tanh activation (``moe/``: the fused
Triton kernel on CUDA, the reference loop on CPU); the routing is the block's own. Experts are
sharded on their intermediate dimension under TP, their partial sums all-reduced; the router is
replicated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers.base import copy_part, copy_weight, divide, new_param
from minisgl.moe import BaseMoeBackend, MoeActivation

GELU_TANH = MoeActivation("gelu_tanh")

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig


class Gemma4MoE(nn.Module):
    """Parameters as the checkpoint's ``router.{proj.weight, scale, per_expert_scale}`` (``gate``,
    ``scale``, ``per_expert_scale``) and ``experts.{gate_up_proj [E, 2I, H], down_proj
    [E, H, I]}`` (this rank's part of I)."""

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator,
                 backend: BaseMoeBackend) -> None:
        super().__init__()
        self.comm, self.top_k, self.eps = comm, cfg.num_experts_per_tok, cfg.rms_norm_eps
        self.backend = backend
        e, h = cfg.num_experts, cfg.hidden_size
        self.inter = divide(cfg.moe_intermediate_size, comm.info.size, "moe_intermediate_size")
        self.gate = new_param(e, h)
        self.scale = new_param(h)
        self.per_expert_scale = new_param(e)
        self.gate_up_proj = new_param(e, 2 * self.inter, h, loader=self._load_gate_up)
        self.down_proj = new_param(e, h, self.inter, loader=self._load_down)

    def _load_gate_up(self, param: nn.Parameter, loaded: torch.Tensor, _=None) -> None:
        full, start = loaded.shape[1] // 2, self.comm.info.rank * self.inter
        for half in (0, 1):  # [gate | up], each cut to this rank's rows
            copy_part(param, loaded, 1, half * self.inter, half * full + start, self.inter)

    def _load_down(self, param: nn.Parameter, loaded: torch.Tensor, _=None) -> None:
        start = self.comm.info.rank * self.inter
        copy_weight(param, loaded.narrow(2, start, self.inter))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        xf = xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        xf = (xf.to(x.dtype) * self.scale * x.shape[-1] ** -0.5)
        probs = F.linear(xf, self.gate).float().softmax(-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True) * self.per_expert_scale[ids]
        return weights, ids

    def forward(self, stream: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``stream`` routes; ``x`` (the stream after its own norm) enters the experts."""
        weights, ids = self.route(stream)
        out = self.backend.forward(x, self.gate_up_proj, self.down_proj, weights.to(x.dtype),
                                   ids, act=GELU_TANH)
        return self.comm.all_reduce(out)
