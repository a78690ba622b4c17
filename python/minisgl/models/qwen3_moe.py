"""Qwen3-MoE: Qwen3's attention; sparse layers swap the MLP for a routed ``MoELayer`` (top-k of
``num_experts``, experts sharded on their intermediate dimension)."""

from __future__ import annotations

from typing import Any

from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import GatedMLP, MoELayer
from minisgl.moe import BaseMoeBackend

from .config import ModelConfig, common_fields
from .llama import LlamaDecoderLayer
from .names import MERGED, CheckpointNames, expert_names
from .qwen3 import Qwen3ForCausalLM


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    # experts' gate/up into the stacked w13[e], down into w2[e]
    names = CheckpointNames({**MERGED, **expert_names("mlp.experts", "mlp")})

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
               else GatedMLP.from_config(cfg, comm))
        return LlamaDecoderLayer(cfg, layer_id, comm, mlp)
