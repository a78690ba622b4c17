"""Sparse MoE block (Qwen3-MoE): a replicated router picks top-k experts per token; the experts are
sharded on their intermediate dimension, so each rank computes a partial sum that is all-reduced."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.moe import BaseMoeBackend

from .base import copy_weight, divide, new_param, shard
from .linear import ReplicatedLinear

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig


class MoELayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, comm: DistributedCommunicator, backend: BaseMoeBackend
    ) -> None:
        super().__init__()
        self.comm, self.backend = comm, backend
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        tp = comm.info
        inter = divide(cfg.moe_intermediate_size, tp.size, "moe_intermediate_size")
        experts, hidden = cfg.num_experts, cfg.hidden_size
        self.gate = ReplicatedLinear(hidden, experts)
        # w13[e] = [gate_e | up_e] (this rank's rows); w2[e] = down_e (this rank's columns)
        self.w13 = new_param(experts, 2 * inter, hidden, loader=self._load_w13)
        self.w2 = new_param(experts, hidden, inter, loader=self._load_w2)
        self.inter = inter

    def _load_w13(
        self, param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[int, int]
    ) -> None:
        expert, which = shard_id
        copy_weight(
            param.data[expert, which * self.inter : (which + 1) * self.inter],
            shard(loaded, 0, self.comm.info),
        )

    def _load_w2(self, param: nn.Parameter, loaded: torch.Tensor, expert: int) -> None:
        copy_weight(param.data[expert], shard(loaded, 1, self.comm.info))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router_logits = self.gate(x)
        weights, ids = torch.topk(router_logits.float().softmax(dim=-1), self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = self.backend.forward(x, self.w13, self.w2, weights.to(x.dtype), ids)
        return self.comm.all_reduce(out)
