"""Qwen3-MoE: Qwen3's attention; sparse layers swap the MLP for a routed ``MoELayer`` (top-k of
``num_experts``, experts sharded on their intermediate dimension)."""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import MoELayer
from minisgl.moe import BaseMoeBackend

from .config import ModelConfig, common_fields
from .llama import GatedMLP, LlamaDecoderLayer
from .qwen3 import Qwen3ForCausalLM

_EXPERT = re.compile(r"(.*)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|weight_scale_inv)$")


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        return ModelConfig(
            **common_fields(raw),
            qk_norm=True,
            num_experts=raw.get("num_experts") or raw.get("num_local_experts") or 0,
            num_experts_per_tok=raw.get("num_experts_per_tok", 0),
            moe_intermediate_size=raw.get("moe_intermediate_size", 0),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            mlp_only_layers=tuple(raw.get("mlp_only_layers") or ()),
            decoder_sparse_step=raw.get("decoder_sparse_step") or 1,
        )

    def make_layer(self, cfg: ModelConfig, layer_id: int, comm: DistributedCommunicator,
                   moe: BaseMoeBackend) -> nn.Module:
        mlp = (MoELayer(cfg, comm, moe, cfg.quant) if cfg.is_sparse_layer(layer_id)
               else GatedMLP(cfg, comm))
        return LlamaDecoderLayer(cfg, layer_id, comm, mlp)

    def checkpoint_names(self, name: str) -> tuple[str, object] | None:
        """Experts' ``gate``/``up`` into the stacked ``w13[e]``, ``down`` into ``w2[e]``."""
        match = _EXPERT.match(name.removeprefix("model."))
        if match is None:
            return super().checkpoint_names(name)
        prefix, expert, kind = match.group(1), int(match.group(2)), match.group(3)
        suffix = "_scale_inv" if match.group(4) == "weight_scale_inv" else ""
        if kind == "down":
            return f"{prefix}.mlp.w2{suffix}", expert
        return f"{prefix}.mlp.w13{suffix}", (expert, 0 if kind == "gate" else 1)
