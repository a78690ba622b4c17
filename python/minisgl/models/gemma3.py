"""Gemma 3's language model: ``Gemma3ForCausalLM`` and the text part of
``Gemma3ForConditionalGeneration`` checkpoints (the vision tower and projector are skipped here:
they are ``models/vision/siglip.py``, which the engine runs, ``engine/images.py``).

Gemma's conventions against Llama's: (1 + w) RMSNorms computed in fp32, a norm before *and* after
attention and the MLP (the residual is added after the post-norm), embeddings scaled by
``sqrt(hidden)`` rounded to the model dtype, a GELU-tanh gated MLP, q/k norms, the query scale
``query_pre_attn_scalar ** -0.5``, and optional final-logit soft-capping. Layers interleave
sliding-window attention (``sliding_window``, the local rope base) with full attention (the global
base and the checkpoint's rope scaling), ``layer_types`` saying which, by default five local
layers per global one. Every layer's window and rope are in its ``AttentionSpec``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import AttentionLayer, GatedMLP, RMSNorm, RotaryEmbedding
from minisgl.moe import BaseMoeBackend

from .base import BaseLLMModel, with_images
from .config import ModelConfig, RotaryConfig, common_fields, rotary_config
from .names import CheckpointNames
from .weight import _checkpoint_shapes

if TYPE_CHECKING:
    from minisgl.context import Context

# Gemma3TextConfig's defaults: a checkpoint's config.json leaves out what equals them
TEXT_DEFAULTS: dict[str, Any] = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
    num_attention_heads=8, num_key_value_heads=4, head_dim=256,
    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131_072, rms_norm_eps=1e-6,
    tie_word_embeddings=True, query_pre_attn_scalar=256, sliding_window=4096,
    final_logit_softcapping=None, attn_logit_softcapping=None, rope_theta=1_000_000.0,
    rope_local_base_freq=10_000.0, sliding_window_pattern=6,
)
# the text model under any of the multimodal layouts' prefixes; the parts of a
# Gemma3ForConditionalGeneration checkpoint that are not the text model skipped
NAMES = CheckpointNames(
    prefixes=(("model.language_model.", ""), ("language_model.model.", ""),
              ("language_model.", ""), ("model.", "")),
    skipped=("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
             "model.multi_modal_projector."))


@dataclass(frozen=True)
class GemmaConfig(ModelConfig):
    """Gemma's fields beside the common ones. ``layer_types``: ``sliding_attention`` or
    ``full_attention`` per layer; ``local_rope_base``: the sliding layers' RoPE base (no
    scaling); ``final_logit_softcap`` / ``attn_logit_softcap``: None or the cap."""

    query_pre_attn_scalar: float = 256.0
    sliding_window: int = 4096
    layer_types: tuple[str, ...] = ()
    local_rope_base: float = 10_000.0
    final_logit_softcap: float | None = None
    attn_logit_softcap: float | None = None

    @property
    def local_rotary(self) -> RotaryConfig:
        """The sliding layers' RoPE: the local base, no scaling, the model's positions."""
        return dataclasses.replace(self.rotary, base=self.local_rope_base, scaling=None)


def parse_gemma3(raw: dict[str, Any]) -> GemmaConfig:
    """A Gemma 3 ``config.json`` (the text config of a multimodal one) with Gemma3TextConfig's
    defaults filled in. RoPE in either spelling: ``rope_theta``/``rope_local_base_freq``/
    ``rope_scaling`` (transformers 4) or ``rope_parameters`` per layer type (5)."""
    text = raw.get("text_config")
    cfg = {**TEXT_DEFAULTS, **(text if isinstance(text, dict) else raw)}
    cfg["architectures"] = raw["architectures"]
    for key in ("eos_token_id", "torch_dtype", "dtype"):
        if key not in cfg and key in raw:
            cfg[key] = raw[key]
    rope = cfg.get("rope_parameters")
    local_base = cfg["rope_local_base_freq"]
    if isinstance(rope, dict) and "full_attention" in rope:
        local_base = rope.get("sliding_attention", {}).get("rope_theta", local_base)
        cfg["rope_parameters"] = rope["full_attention"]
    if cfg["hidden_activation"] not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"hidden_activation {cfg['hidden_activation']!r} is not supported "
                         "(gelu_pytorch_tanh)")
    n = cfg["num_hidden_layers"]
    pattern = cfg.get("sliding_window_pattern") or 6
    types = cfg.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"layer_types: {n} entries of sliding_attention/full_attention expected")
    fields = common_fields(cfg)
    fields.update(rotary=rotary_config(cfg, fields["head_dim"], fields["max_position"]),
                  hidden_act="gelu_pytorch_tanh")
    return GemmaConfig(
        **fields, qk_norm=True,
        query_pre_attn_scalar=float(cfg["query_pre_attn_scalar"]),
        sliding_window=int(cfg["sliding_window"]), layer_types=tuple(types),
        local_rope_base=float(local_base),
        final_logit_softcap=cfg.get("final_logit_softcapping"),
        attn_logit_softcap=cfg.get("attn_logit_softcapping"),
    )


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: GemmaConfig, layer_id: int, comm: DistributedCommunicator) -> None:
        super().__init__()
        sliding = cfg.layer_types[layer_id] == "sliding_attention"
        rotary = cfg.local_rotary if sliding else cfg.rotary
        self.self_attn = AttentionLayer(
            cfg, layer_id, comm, scale=cfg.query_pre_attn_scalar**-0.5,
            sliding_window=cfg.sliding_window if sliding else None,
            logit_softcap=cfg.attn_logit_softcap, rotary=RotaryEmbedding(rotary),
            norm=functools.partial(RMSNorm, offset=1.0),
        )
        self.mlp = GatedMLP.from_config(cfg, comm)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_layernorm = RMSNorm(h, eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(h, eps, offset=1.0)
        self.pre_feedforward_layernorm = RMSNorm(h, eps, offset=1.0)
        self.post_feedforward_layernorm = RMSNorm(h, eps, offset=1.0)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), positions, ctx)
        x = self.post_attention_layernorm.add_to(x, h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        return self.post_feedforward_layernorm.add_to(x, h)


class Gemma3ForCausalLM(BaseLLMModel):
    cfg: GemmaConfig
    softcaps_logits = True  # final_logit_softcapping, when the config sets it
    norm_options = {"offset": 1.0}
    names = NAMES

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        return parse_gemma3(raw)

    def make_layer(self, cfg: GemmaConfig, layer_id: int, comm: DistributedCommunicator,
                   moe: BaseMoeBackend) -> nn.Module:
        return Gemma3DecoderLayer(cfg, layer_id, comm)

    @classmethod
    def checkpoint_shapes(cls, cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
        """A Llama-style checkpoint's tensors plus Gemma's norms around the MLP (dummy
        weights)."""
        yield from _checkpoint_shapes(cfg)
        for i in range(cfg.num_layers):
            for norm in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
                yield f"model.layers.{i}.{norm}.weight", (cfg.hidden_size,)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: Context) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        # the reference rounds sqrt(hidden) to the model dtype before multiplying
        x = x * torch.tensor(self.cfg.hidden_size**0.5, dtype=x.dtype)
        x = with_images(x, ctx)  # an image's rows are not scaled (transformers' Gemma3Model)
        for layer in self.layers:
            x = layer(x, positions, ctx)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.cfg.final_logit_softcap
        if cap is None or not self.softcaps_logits:
            return logits
        return torch.tanh(logits / cap) * cap


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    """The multimodal checkpoint: its ``text_config``, its language model (the vision tower runs
    in the engine, ``engine/images.py``). As in the reference's multimodal class, the final
    logits are not soft-capped (the released checkpoints set no cap; a greedy choice is the same
    either way). An image's tokens attend to each other both ways in every layer
    (transformers' ``token_type_ids`` mask)."""

    softcaps_logits = False

    def __init__(self, cfg: GemmaConfig, comm: DistributedCommunicator,
                 moe: BaseMoeBackend) -> None:
        super().__init__(cfg, comm, moe)
        for layer in self.layers:
            attn = layer.self_attn
            attn.spec = dataclasses.replace(attn.spec, image_blocks=True)
