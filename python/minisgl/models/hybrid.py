"""The decoder every hybrid family shares (Qwen3-Next, Qwen3.5, Qwen3.6): Gated DeltaNet layers
(``layers/linear_attention.py``) between gated full-attention layers (``AttentionLayer`` with an
output gate, ``hybrid_layers.py``), as ``cfg.hybrid.layer_types`` lays them out, each followed by an
MoE with a gated shared expert or a dense MLP.

The model declares two caches (``cache_spec``): the paged KV of its full-attention layers only,
and a state slot per request for its linear layers. A family file sets the checkpoint's
conventions: its Gated DeltaNet projections (``linear_cls``, ``split_projs``), where the text
decoder's weights live (``prefix``) and what is skipped. The multi-token-prediction head of the
checkpoints is loaded only for the ``mtp`` speculative method (``add_mtp``, ``models/mtp.py``);
otherwise it is skipped, and loading says so.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable, Iterator

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.kvcache.spec import CacheSpec
from minisgl.kvcache.state_pool import StateShape
from minisgl.layers import GatedMLP, RMSNorm
from minisgl.layers.linear_attention import GatedDeltaNet
from minisgl.moe import BaseMoeBackend
from minisgl.utils import init_logger

from .base import BaseLLMModel
from .config import HybridConfig, ModelConfig, common_fields
from .hybrid_layers import SharedExpertMoE, gated_attention
from .hybrid_weights import checkpoint_shapes, unfuse_experts
from .names import MERGED, CheckpointNames, expert_names

if TYPE_CHECKING:
    from minisgl.context import Context

logger = init_logger(__name__)


class HybridDecoderLayer(nn.Module):
    def __init__(self, model: HybridModel, cfg: ModelConfig, layer_id: int,
                 comm: DistributedCommunicator, moe: BaseMoeBackend) -> None:
        super().__init__()
        hybrid = cfg.hybrid
        index = hybrid.index(layer_id)  # among the layers of its kind: a KV or a state layer
        self.is_linear = hybrid.layer_types[layer_id] == "linear_attention"
        if self.is_linear:
            self.linear_attn = model.linear_cls(hybrid.linear, cfg.hidden_size, cfg.rms_norm_eps,
                                                index, comm, cfg.quant)
        else:
            self.self_attn = gated_attention(cfg, layer_id, index, comm)
        if cfg.is_sparse_layer(layer_id):
            self.mlp = SharedExpertMoE(cfg, hybrid.shared_expert_intermediate_size, comm, moe)
        else:
            self.mlp = GatedMLP.from_config(cfg, comm)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.add_norm(x, residual)
        x = self.linear_attn(x, ctx) if self.is_linear else self.self_attn(x, positions, ctx)
        x, residual = self.post_attention_layernorm.add_norm(x, residual)
        return self.mlp(x), residual


# checkpoint name after ``layers.N.`` -> (ours, shard id), beside Llama's merged projections
RENAMES: dict[str, tuple[str, object]] = {
    **MERGED,
    "mlp.shared_expert.gate_proj": ("mlp.shared_expert.gate_up_proj", 0),
    "mlp.shared_expert.up_proj": ("mlp.shared_expert.gate_up_proj", 1),
    "mlp.shared_expert_gate.weight": ("mlp.shared_expert_gate", None),
    "mlp.gate": ("mlp.experts.gate", None),
    "linear_attn.conv1d.weight": ("linear_attn.conv1d_weight", None),
    "linear_attn.norm.weight": ("linear_attn.norm_weight", None),
    **expert_names("mlp.experts", "mlp.experts"),
}


class HybridModel(BaseLLMModel):
    """The decoder of every hybrid family; subclasses set the checkpoint conventions."""

    linear_cls: type[GatedDeltaNet]
    norm_options = {"offset": 1.0}
    prefix = "model."
    # checkpoint parts that are not the text model: skipped, and loading says so
    skipped = {"mtp.": "the multi-token-prediction head (loaded for the speculative method 'mtp')"}
    # checkpoint projection name -> (our SplitColumnLinear, its part ids)
    split_projs = {"in_proj_qkvz": ("in_proj_qkvz", (0,)), "in_proj_ba": ("in_proj_ba", (0,))}

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator,
                 moe: BaseMoeBackend) -> None:
        super().__init__(cfg, comm, moe)
        linear = {f"linear_attn.{k}": (f"linear_attn.{ours}", ids)
                  for k, (ours, ids) in self.split_projs.items()}
        # only the text decoder's names, the LM head's and the MTP head's are loaded
        self.names = CheckpointNames(
            {**RENAMES, **linear}, skipped=tuple(self.skipped), strict=True,
            prefixes=((self.prefix, ""), ("lm_head.", "lm_head."), ("mtp.", "mtp.")))

    @classmethod
    def parse_config(cls, raw: dict) -> ModelConfig:
        """A vision-language checkpoint's ``text_config`` is read as the model's config."""
        if isinstance(raw.get("text_config"), dict):
            outer = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}
            raw = {**outer, **raw["text_config"], "architectures": raw["architectures"]}
        return ModelConfig(
            **common_fields(raw),
            num_experts=raw.get("num_experts") or 0,
            num_experts_per_tok=raw.get("num_experts_per_tok", 0),
            moe_intermediate_size=raw.get("moe_intermediate_size", 0),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            mlp_only_layers=tuple(raw.get("mlp_only_layers") or ()),
            decoder_sparse_step=raw.get("decoder_sparse_step") or 1,
            hybrid=HybridConfig.from_dict(raw),
        )

    def make_layer(self, cfg: ModelConfig, layer_id: int, comm: DistributedCommunicator,
                   moe: BaseMoeBackend) -> nn.Module:
        return HybridDecoderLayer(self, cfg, layer_id, comm, moe)

    def add_mtp(self, comm: DistributedCommunicator, moe: BaseMoeBackend) -> None:
        """Build the MTP head (``mtp.*`` then loads into it) for the ``mtp`` speculative
        method."""
        from .mtp import MTPHead

        if self.cfg.hybrid.mtp_layers < 1:
            raise ValueError("speculative_config: method 'mtp' needs a checkpoint with an MTP "
                             "head (mtp_num_hidden_layers >= 1 in its config)")
        self.mtp = MTPHead(self.cfg, comm, moe, self.cache_spec().num_kv_layers)
        self.draft_attention = self.mtp.layers[0].self_attn.spec
        self.skipped = {k: v for k, v in self.skipped.items() if k != "mtp."}
        self.names = dataclasses.replace(self.names, skipped=tuple(self.skipped))

    def cache_spec(self) -> CacheSpec:
        """KV for the gated-attention layers, a state slot per linear layer."""
        lin = next(layer.linear_attn for layer in self.layers if layer.is_linear)
        shape = StateShape(lin.conv_dim, lin.conv_width, lin.num_v_heads, lin.k_dim, lin.v_dim)
        return CacheSpec(tuple(layer.self_attn.spec for layer in self.layers
                               if not layer.is_linear), shape,
                         self.cfg.hybrid.count("linear_attention"), self.draft_attention)

    def expand_tensor(self, name: str, tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Fused experts split per expert; a skipped part of the checkpoint is named once."""
        for skip, what in self.skipped.items():
            if name.startswith(skip) and skip not in self._skipped_seen:
                self._skipped_seen.add(skip)
                logger.info("not loaded: %s (%s*)", what, skip)
        return unfuse_experts(name, tensor)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._skipped_seen: set[str] = set()
        super().load_weights(weights)
        # the KV pool holds the full-attention layers only: its scales go by their index
        hybrid = self.cfg.hybrid
        self.kv_scales = {hybrid.index(i): s for i, s in self.kv_scales.items()
                          if hybrid.layer_types[i] == "full_attention"}

    @classmethod
    def checkpoint_shapes(cls, cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Names and full shapes of a checkpoint of ``cfg`` (for ``--dummy-weights``)."""
        return checkpoint_shapes(cfg, cls.prefix, cls.linear_shapes)

    @staticmethod
    def linear_shapes(h: int, hk: int, hv: int, dk: int, dv: int):
        yield "in_proj_qkvz.weight", (2 * hk * dk + 2 * hv * dv, h)
        yield "in_proj_ba.weight", (2 * hv, h)
