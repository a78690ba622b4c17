"""Sparse MoE block (Qwen3-MoE): a replicated router picks top-k experts per token; the experts are
sharded on their intermediate dimension, so each rank computes a partial sum that is all-reduced.

With a format that quantizes experts (``QuantizationConfig.expert_block``: FP8) the stacked expert
weights are e4m3 with per-expert block scales ``w13_scale_inv [E, 2I/bn, H/bk]`` and
``w2_scale_inv [E, H/bn, I/bk]``, loaded from the checkpoint or quantized after loading (online);
the router stays unquantized.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.moe import BaseMoeBackend
from minisgl.quant import FP8, QuantizationConfig, quantize_block

from .base import copy_part, divide, new_param
from .linear import ReplicatedLinear

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig


class MoELayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, comm: DistributedCommunicator, backend: BaseMoeBackend,
        quant: QuantizationConfig | None = None,
    ) -> None:
        super().__init__()
        self.comm, self.backend = comm, backend
        self.block = None if quant is None else quant.expert_block()
        self.online = quant is not None and quant.online
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        tp = comm.info
        inter = divide(cfg.moe_intermediate_size, tp.size, "moe_intermediate_size")
        experts, hidden = cfg.num_experts, cfg.hidden_size
        self.gate = ReplicatedLinear(hidden, experts, quant)
        fp8 = self.block is not None and not self.online
        dtype = FP8 if fp8 else None
        # w13[e] = [gate_e | up_e] (this rank's rows); w2[e] = down_e (this rank's columns)
        self.w13 = new_param(experts, 2 * inter, hidden, loader=self._load_w13, dtype=dtype)
        self.w2 = new_param(experts, hidden, inter, loader=self._load_w2, dtype=dtype)
        self.w13_scale_inv = self.w2_scale_inv = None
        if fp8:
            bn, bk = self.block
            self.w13_scale_inv = new_param(experts, -(-2 * inter // bn), -(-hidden // bk),
                                           dtype=torch.float32,
                                           loader=functools.partial(self._load_w13, unit=bn))
            self.w2_scale_inv = new_param(experts, -(-hidden // bn), -(-inter // bk),
                                          dtype=torch.float32,
                                          loader=functools.partial(self._load_w2, unit=bk))
        self.inter = inter

    def _load_w13(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[int, int],
                  unit: int = 1) -> None:
        expert, which = shard_id
        start = self.comm.info.rank * self.inter
        copy_part(param.data[expert], loaded, 0, which * self.inter, start, self.inter, unit)

    def _load_w2(self, param: nn.Parameter, loaded: torch.Tensor, expert: int,
                 unit: int = 1) -> None:
        start = self.comm.info.rank * self.inter
        copy_part(param.data[expert], loaded, 1, 0, start, self.inter, unit)

    # the norm before feeds no single linear layer (``layers.fusion``)
    input_linear = None

    def process_weights_after_loading(self) -> None:
        """``--quantization fp8`` / ``fp8-block``: every expert's weights to e4m3 with block
        scales. Per-channel quantization (``fp8``'s for dense layers) is not applied to experts:
        the fused MoE kernel reads block scales, so experts keep ``expert_block`` in both modes."""
        if self.block is None or not self.online or self.w13.dtype == FP8:
            return
        for name in ("w13", "w2"):
            q, s = quantize_block(getattr(self, name).data, self.block)
            setattr(self, name, nn.Parameter(q, requires_grad=False))
            setattr(self, name + "_scale_inv", nn.Parameter(s, requires_grad=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        router_logits = self.gate(x)
        weights, ids = torch.topk(router_logits.float().softmax(dim=-1), self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        scales = None
        if self.w13_scale_inv is not None:
            scales = (self.w13_scale_inv, self.w2_scale_inv, self.block)
        out = self.backend.forward(x, self.w13, self.w2, weights.to(x.dtype), ids, scales)
        return self.comm.all_reduce(out)
