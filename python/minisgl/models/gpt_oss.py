"""gpt-oss (OpenAI's open-weight MoE): Llama's pre-norm decoder layer around

- attention with a bias on q, k, v and o, a learned sink logit per head, YaRN RoPE, and a
  sliding window (128) on the layers ``layer_types`` names ``sliding_attention`` (every other);
- a MoE block of its own kind: a router with a bias whose top-k logits are softmaxed, experts
  with biases and a clamped SwiGLU (``(clamp(up) + 1) * glu``), stored fused with gate and up
  interleaved (``gate_up_proj``), in MXFP4 in the released checkpoints (``quant.mxfp4_moe``).

Checkpoint names map through ``NAMES`` (one row per tensor kind, declarative); the stacked experts
load whole (``layers.moe.Stacked``), in transformers' unquantized layout (``[E, H, 2I]``,
``[E, I, H]``) or as MXFP4 blocks and scales (``[E, 2I, H/32, 16]``, ``[E, H, I/32, 16]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import AttentionLayer, LinearRowParallel
from minisgl.layers.moe import MoELayer, MoESpec, Stacked
from minisgl.moe import BaseMoeBackend, MoeActivation

from .base import BaseLLMModel
from .config import ModelConfig, common_fields
from .llama import LlamaDecoderLayer
from .names import MERGED, CheckpointNames
from .weight import attention_shapes

LAYER_TYPES = ("sliding_attention", "full_attention")

NAMES = CheckpointNames({
    **MERGED,
    "mlp.router": ("mlp.gate", None),
    "mlp.experts.gate_up_proj": ("mlp.w13", Stacked(interleaved=True, transposed=True)),
    "mlp.experts.gate_up_proj_bias": ("mlp.w13_bias", Stacked(interleaved=True)),
    "mlp.experts.down_proj": ("mlp.w2", Stacked(transposed=True)),
    "mlp.experts.down_proj_bias": ("mlp.w2_bias", None),
    "mlp.experts.gate_up_proj_blocks": ("mlp.w13", Stacked(interleaved=True)),
    "mlp.experts.gate_up_proj_scales": ("mlp.w13_scales", Stacked(interleaved=True)),
    "mlp.experts.down_proj_blocks": ("mlp.w2", Stacked()),
    "mlp.experts.down_proj_scales": ("mlp.w2_scales", Stacked()),
})


@dataclass(frozen=True)
class GptOssConfig(ModelConfig):
    """``layer_types``: each layer's attention (``sliding_attention`` or ``full_attention``)."""

    layer_types: tuple[str, ...] = ()
    sliding_window: int = 128
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def window(self, layer_id: int) -> int | None:
        return self.sliding_window if self.layer_types[layer_id] == "sliding_attention" else None


class GptOssForCausalLM(BaseLLMModel):
    names = NAMES

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> GptOssConfig:
        n = raw["num_hidden_layers"]
        types = tuple(raw.get("layer_types") or
                      ("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)))
        if len(types) != n or any(t not in LAYER_TYPES for t in types):
            raise ValueError(f"layer_types: must list {n} entries of {', '.join(LAYER_TYPES)}")
        window = raw.get("sliding_window") or 128
        experts = raw.get("num_local_experts") or raw.get("num_experts") or 0
        top_k = raw.get("num_experts_per_tok") or raw.get("experts_per_token") or 0
        if experts <= 0 or top_k <= 0:
            raise ValueError("num_local_experts and num_experts_per_tok: gpt-oss needs both > 0")
        fields = common_fields(raw)
        fields["attention_bias"] = bool(raw.get("attention_bias", True))
        return GptOssConfig(
            **fields, num_experts=experts, num_experts_per_tok=top_k,
            moe_intermediate_size=raw["intermediate_size"], layer_types=types,
            sliding_window=int(window), swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
            swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
        )

    def make_layer(self, cfg: GptOssConfig, layer_id: int, comm: DistributedCommunicator,
                   moe: BaseMoeBackend) -> nn.Module:
        spec = MoESpec(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
                       routing="topk_softmax", router_bias=True, expert_bias=True,
                       act=MoeActivation("swiglu_clamped", cfg.swiglu_alpha, cfg.swiglu_limit))
        attn = AttentionLayer(cfg, layer_id, comm, sliding_window=cfg.window(layer_id), sinks=True)
        # NOTE: AttentionLayer's output projection has no bias; gpt-oss's has one
        attn.o_proj = LinearRowParallel(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, True,
                                        comm, cfg.quant)
        return LlamaDecoderLayer(cfg, layer_id, comm, MoELayer(cfg, comm, moe, cfg.quant, spec),
                                 attn=attn)

    @staticmethod
    def checkpoint_shapes(cfg: GptOssConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
        """An unquantized checkpoint's names and shapes (``--dummy-weights``; an MXFP4 config
        turns the experts into blocks and scales, ``Mxfp4Config.checkpoint_tensors``)."""
        h, inter, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
        yield "model.embed_tokens.weight", (cfg.vocab_size, h)
        yield "lm_head.weight", (cfg.vocab_size, h)
        yield "model.norm.weight", (h,)
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            yield from attention_shapes(cfg, p)  # q/k/v biases: attention_bias
            yield p + "self_attn.o_proj.bias", (h,)
            yield p + "self_attn.sinks", (cfg.num_qo_heads,)
            yield p + "mlp.router.weight", (e, h)
            yield p + "mlp.router.bias", (e,)
            yield p + "mlp.experts.gate_up_proj", (e, h, 2 * inter)
            yield p + "mlp.experts.gate_up_proj_bias", (e, 2 * inter)
            yield p + "mlp.experts.down_proj", (e, inter, h)
            yield p + "mlp.experts.down_proj_bias", (e, h)
