"""Sparse MoE block: a replicated router picks top-k experts per token; the experts are sharded on
their intermediate dimension, so each rank computes a partial sum that is all-reduced.

The layer shards, loads and routes; how the experts are stored, what loading leaves to do and
which storage the MoE backend runs are the ``MoEMethod``'s that the quantization config hands it
(``minisgl.quant``: the model's dtype, FP8 blocks, MXFP4). ``MoESpec`` holds what the families
differ in: the routing, router and expert biases, the router's scales, the activation.

Checkpoint tensors reach the stacked parameters per expert (shard id ``(expert, 0 | 1)`` for an
expert's gate | up, ``expert`` for its down projection) or stacked over the experts (shard id
``Stacked``: transformers' fused ``experts.gate_up_proj`` / ``down_proj`` and gpt-oss's MXFP4
``*_blocks`` / ``*_scales``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.moe import SILU, BaseMoeBackend, ExpertBias, ExpertLayout, MoeActivation
from minisgl.quant import QuantizationConfig, moe_method

from .base import copy_part, copy_weight, divide, materialize, new_param
from .linear import ReplicatedLinear
from .norm import RMSNorm

if TYPE_CHECKING:
    from minisgl.models.config import ModelConfig

ROUTINGS = ("softmax", "topk_softmax")


@dataclass(frozen=True)
class MoESpec:
    """``routing``: ``softmax`` (Qwen: softmax over every expert's logit, top-k, renormalised
    to sum 1 when ``renormalize``) or ``topk_softmax`` (gpt-oss: the top-k logits, softmax over
    them). ``router_bias``/``expert_bias``: the router and both expert projections have biases.
    ``router_scales`` (Gemma 4): the router reads its input RMS-normalised (no weight) times a
    learned ``router_scale [H]`` and ``hidden ** -0.5``, and each routed weight is multiplied by
    its expert's learned ``expert_scale``."""

    num_experts: int
    top_k: int
    intermediate_size: int
    routing: str = "softmax"
    renormalize: bool = True
    router_bias: bool = False
    expert_bias: bool = False
    router_scales: bool = False
    act: MoeActivation = SILU

    def __post_init__(self) -> None:
        if self.routing not in ROUTINGS:
            raise ValueError(f"MoE routing {self.routing!r} is not one of {', '.join(ROUTINGS)}")
        if not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok: {self.top_k} must be in 1..num_experts "
                             f"({self.num_experts})")

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> MoESpec:
        return cls(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
                   renormalize=cfg.norm_topk_prob)


@dataclass(frozen=True)
class Stacked:
    """Shard id of a checkpoint tensor holding every expert. Gate-up: ``[E, 2I, ...]``, each
    expert's gate rows then its up rows, or ``interleaved`` pairs (row 2j gate j, row 2j + 1 up j,
    gpt-oss). Down: ``[E, H, C, ...]``, where index c of dim 2 covers ``unit`` columns of I (the
    parameter's unit: 32 for MXFP4 groups). ``transposed``: the rows are the last dimension
    instead (``[E, H, 2I]``, ``[E, I, H]``: transformers' unquantized layout)."""

    interleaved: bool = False
    transposed: bool = False


def _read(t) -> torch.Tensor:
    return t.load() if hasattr(t, "load") else t


class MoELayer(nn.Module):
    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def __init__(
        self, cfg: ModelConfig, comm: DistributedCommunicator, backend: BaseMoeBackend,
        quant: QuantizationConfig | None = None, spec: MoESpec | None = None,
    ) -> None:
        super().__init__()
        spec = spec or MoESpec.from_config(cfg)
        self.comm, self.backend, self.spec = comm, backend, spec
        self.inter_total = spec.intermediate_size
        self.inter = divide(spec.intermediate_size, comm.info.size, "moe_intermediate_size")
        experts, hidden = spec.num_experts, cfg.hidden_size
        self.gate = ReplicatedLinear(hidden, experts, quant, bias=spec.router_bias)
        self.method = moe_method(quant)
        self.method.create_weights(self, experts, hidden, self.inter, self._new_param)
        self.router_norm = self.router_scale = self.expert_scale = None
        if spec.router_scales:
            self.router_norm = RMSNorm(hidden, cfg.rms_norm_eps, scale=False)
            self.router_scale, self.expert_scale = new_param(hidden), new_param(experts)
        self.w13_bias = self.w2_bias = None
        self.layout: ExpertLayout | None = None  # the backend's own copy of the experts, if any
        if spec.expert_bias:
            self.w13_bias = self._new_param("w13", experts, 2 * self.inter)
            self.w2_bias = new_param(experts, hidden)  # replicated: every rank loads it whole

    def _new_param(self, which: str, *shape: int, dtype: torch.dtype | None = None,
                   unit: int = 1, deferred: bool = False) -> nn.Parameter:
        loader = self._load_w13 if which == "w13" else self._load_w2
        return new_param(*shape, loader=functools.partial(loader, unit=unit), dtype=dtype,
                         deferred=deferred)

    def _load_w13(self, param: nn.Parameter, loaded: torch.Tensor, shard_id,
                  unit: int = 1) -> None:
        materialize(param)
        if isinstance(shard_id, Stacked):
            return self._load_w13_stacked(param, loaded, shard_id, unit)
        expert, which = shard_id
        start = self.comm.info.rank * self.inter
        copy_part(param.data[expert], loaded, 0, which * self.inter, start, self.inter, unit)

    def _load_w13_stacked(self, param: nn.Parameter, loaded, how: Stacked, unit: int) -> None:
        inter, start = self.inter, self.comm.info.rank * self.inter
        if not how.interleaved and not how.transposed:  # block-scaled rows are fine here
            for which in (0, 1):
                copy_part(param, loaded, 1, which * inter, which * self.inter_total + start,
                          inter, unit)
            return
        if unit != 1:
            raise ValueError("scale blocks over rows cannot be cut from interleaved or "
                             "transposed experts")
        row_dim = len(loaded.shape) - 1 if how.transposed and len(loaded.shape) > 2 else 1
        if how.interleaved:
            part = _read(loaded.narrow(row_dim, 2 * start, 2 * inter)).movedim(row_dim, 1)
            part = part.reshape(part.shape[0], 2 * inter, -1)
            halves = part[:, 0::2], part[:, 1::2]
        else:
            halves = tuple(
                _read(loaded.narrow(row_dim, which * self.inter_total + start, inter))
                .movedim(row_dim, 1).reshape(loaded.shape[0], inter, -1) for which in (0, 1))
        dst = param.data.view(param.shape[0], 2 * inter, -1)
        for which, half in enumerate(halves):
            copy_weight(dst[:, which * inter : (which + 1) * inter], half)

    def _load_w2(self, param: nn.Parameter, loaded: torch.Tensor, shard_id,
                 unit: int = 1) -> None:
        materialize(param)
        start = self.comm.info.rank * self.inter
        if not isinstance(shard_id, Stacked):
            copy_part(param.data[shard_id], loaded, 1, 0, start, self.inter, unit)
            return
        if shard_id.transposed:
            if unit != 1:
                raise ValueError("scale blocks cannot be cut from transposed experts")
            part = _read(loaded.narrow(1, start, self.inter)).transpose(1, 2)
        else:
            if start % unit or self.inter % unit:
                raise ValueError(f"the intermediate size per rank ({self.inter}) must be a "
                                 f"multiple of the scale group ({unit})")
            part = _read(loaded.narrow(2, start // unit, self.inter // unit))
        if part.shape[:2] != param.shape[:2] or part.numel() != param.numel():
            raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint part "
                             f"{tuple(part.shape)}")
        copy_weight(param, part.reshape(param.shape))

    # the norm before feeds no single linear layer (``layers.fusion``)
    input_linear = None

    def process_weights_after_loading(self) -> None:
        if self.layout is not None:  # already taken over by the backend
            return
        self.method.process_weights_after_loading(self)
        self.layout = self.backend.prepare_experts(*self.method.experts(self), self._bias(),
                                                   self.spec.act)
        if self.layout is not None:  # the backend's copy replaces the layer's
            for name in ("w13", "w2", "w13_scales", "w2_scales", "w13_bias", "w2_bias"):
                param = getattr(self, name, None)
                if isinstance(param, torch.Tensor):
                    param.data = param.data.new_empty(0)

    def route(self, router_logits: torch.Tensor, dtype: torch.dtype = torch.float32
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (weights [T, K] in ``dtype``, computed in float32; expert ids [T, K])."""
        k = self.spec.top_k
        if router_logits.is_cuda and k & (k - 1) == 0:  # one launch instead of four
            from minisgl.kernel.triton.topk_route import topk_route

            weights, ids = topk_route(
                router_logits, k, self.spec.routing == "softmax", self.spec.renormalize,
                dtype if self.expert_scale is None else torch.float32, self.pdl)
        elif self.spec.routing == "topk_softmax":
            values, ids = torch.topk(router_logits, k, dim=-1)
            weights = values.float().softmax(dim=-1)
        else:
            weights, ids = torch.topk(router_logits.float().softmax(dim=-1), k, dim=-1)
            if self.spec.renormalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        if self.expert_scale is not None:  # Gemma 4's per-expert scales, after renormalizing
            weights = weights * self.expert_scale[ids]
        return weights.to(dtype), ids

    def forward(self, x: torch.Tensor, router_input: torch.Tensor | None = None) -> torch.Tensor:
        """``router_input``: what the router reads where it is not x (Gemma 4 routes on the
        stream before the norm whose output enters the experts)."""
        r = x if router_input is None else router_input
        if self.router_norm is not None:
            r = self.router_norm(r) * self.router_scale * r.shape[-1] ** -0.5
        weights, ids = self.route(self.gate(r), x.dtype)
        w13, w2, scales = self.method.experts(self)
        out = self.backend.forward(x, w13, w2, weights, ids, scales, bias=self._bias(),
                                   act=self.spec.act, pdl=self.pdl, layout=self.layout)
        return self.comm.all_reduce(out)

    @property
    def layout_bytes(self) -> int:
        """Device bytes of the backend's own copy of the experts (0 without one)."""
        return self.layout.nbytes if self.layout is not None else 0

    def _bias(self) -> ExpertBias | None:
        if self.w13_bias is None:
            return None
        # the down bias once over the ranks' partial sums
        return ExpertBias(self.w13_bias, self.w2_bias if self.comm.info.rank == 0 else None)
