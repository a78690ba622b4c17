"""Gemma 4, text only: ``Gemma4ForCausalLM``, and the text part of a
``Gemma4ForConditionalGeneration`` checkpoint such as gemma-4-26b-a4b (the vision and audio towers
are skipped).

Against Gemma 3: RMSNorms scale by ``w`` (not ``1 + w``); v gets a norm without a scale; the query
scale is 1 (q and k are normalised); global layers have their own head size
(``global_head_dim``), KV heads (``num_global_key_value_heads``) and, with ``attention_k_eq_v``,
no v projection (V is K's projection before its norm and RoPE: loading copies ``k_proj`` into the
v slot of the merged projection), and a proportional partial RoPE (``RotaryEmbedding`` with the
``proportional`` scaling); local layers take the default RoPE. Each layer's output is multiplied
by a loaded ``layer_scalar``. With ``enable_moe_block`` every layer adds a routed MoE beside its
dense MLP: a ``MoELayer`` with GELU-tanh experts and Gemma's router scales
(``MoESpec.router_scales``), its experts stored as the quantization config says like any family's.
Per-layer input embeddings and KV sharing across layers (Gemma 3n-style) are refused.
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
from minisgl.layers.base import new_param
from minisgl.layers.moe import MoELayer, MoESpec, Stacked
from minisgl.moe import BaseMoeBackend, MoeActivation

from .config import ModelConfig, RotaryConfig, common_fields, rotary_config
from .gemma3 import NAMES as GEMMA3_NAMES
from .gemma3 import TEXT_DEFAULTS, Gemma3ForCausalLM, GemmaConfig
from .names import MERGED

if TYPE_CHECKING:
    from minisgl.context import Context

# the text model's tensors, its MoE block's router and experts in the layer's ``moe``; the vision
# and audio towers skipped
NAMES = dataclasses.replace(GEMMA3_NAMES, renames={
    **MERGED,
    "router.proj": ("moe.gate", None),
    "router.scale": ("moe.router_scale", None),
    "router.per_expert_scale": ("moe.expert_scale", None),
    "experts.gate_up_proj": ("moe.w13", Stacked()),
    "experts.down_proj": ("moe.w2", Stacked()),
}, skipped=GEMMA3_NAMES.skipped + ("model.audio_tower.", "model.embed_vision.",
                                   "model.embed_audio.", "audio_tower."))


@dataclass(frozen=True)
class Gemma4Config(GemmaConfig):
    """Gemma 4's fields beside Gemma 3's: each layer's ``(head_dim, kv_heads)`` (the global
    layers' own, from ``per_layer_config`` or ``global_head_dim``/``num_global_key_value_heads``),
    K = V on global layers, their RoPE (``global_rope_base``, ``global_rope_fraction`` of the
    head rotated); the MoE block."""

    layer_attn: tuple[tuple[int, int], ...] = ()
    k_eq_v: bool = True
    global_rope_base: float = 1_000_000.0
    global_rope_fraction: float = 1.0
    moe_block: bool = False


def parse_gemma4(raw: dict[str, Any]) -> Gemma4Config:
    text = raw.get("text_config")
    cfg = {**(text if isinstance(text, dict) else raw), "architectures": raw["architectures"]}
    for key in ("eos_token_id", "torch_dtype", "dtype"):
        if key not in cfg and key in raw:
            cfg[key] = raw[key]
    for key, why in (("hidden_size_per_layer_input", "per-layer input embeddings"),
                     ("num_kv_shared_layers", "KV sharing across layers")):
        if cfg.get(key):
            raise ValueError(f"{key}: {why} (Gemma 3n-style) are not supported")
    if cfg.get("use_bidirectional_attention") == "all":
        raise ValueError("use_bidirectional_attention: 'all' is not supported (text is causal)")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise ValueError(f"hidden_activation {act!r} is not supported (gelu_pytorch_tanh)")
    rope = cfg.get("rope_parameters") or {}
    full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
    if full.get("rope_type", "default") not in ("default", "proportional") or full.get("factor"):
        raise ValueError(f"rope_parameters.full_attention: {full} is not supported "
                         "(default or proportional, no factor)")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": local.get("rope_theta", 1e4)}
    types = cfg.get("layer_types") or []
    if len(types) != cfg["num_hidden_layers"]:
        raise ValueError(f"layer_types: {cfg['num_hidden_layers']} entries expected")
    fields = common_fields(cfg)
    fields.update(rotary=rotary_config(cfg, fields["head_dim"], fields["max_position"]),
                  hidden_act="gelu_pytorch_tanh",
                  tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)))
    moe = bool(cfg.get("enable_moe_block"))
    k_eq_v = bool(cfg.get("attention_k_eq_v"))
    return Gemma4Config(
        **fields, qk_norm=True, query_pre_attn_scalar=1.0,
        sliding_window=int(cfg.get("sliding_window") or TEXT_DEFAULTS["sliding_window"]),
        layer_types=tuple(types), local_rope_base=float(local.get("rope_theta", 1e4)),
        final_logit_softcap=cfg.get("final_logit_softcapping"),
        attn_logit_softcap=cfg.get("attn_logit_softcapping"),
        layer_attn=layer_attention(cfg, types, fields["head_dim"], fields["num_kv_heads"],
                                   k_eq_v),
        k_eq_v=k_eq_v,
        global_rope_base=float(full.get("rope_theta", 1e6)),
        global_rope_fraction=float(full.get("partial_rotary_factor", 1.0)),
        moe_block=moe, num_experts=int(cfg.get("num_experts") or 0) if moe else 0,
        num_experts_per_tok=int(cfg.get("top_k_experts") or 0) if moe else 0,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0) if moe else 0,
    )


def layer_attention(cfg: dict[str, Any], types: list[str], head_dim: int, kv_heads: int,
                    k_eq_v: bool) -> tuple[tuple[int, int], ...]:
    """``(head_dim, kv_heads)`` of every layer: ``per_layer_config`` overrides by layer index (as
    transformers writes it), else the global layers take ``global_head_dim`` (512) and, with
    K = V, ``num_global_key_value_heads``."""
    per_layer = cfg.get("per_layer_config")
    if per_layer is None:
        glob: dict[str, Any] = {"head_dim": cfg.get("global_head_dim", 512)}
        if k_eq_v and cfg.get("num_global_key_value_heads"):
            glob["num_key_value_heads"] = cfg["num_global_key_value_heads"]
        per_layer = {str(i): glob for i, t in enumerate(types) if t == "full_attention"}
    out = []
    for i in range(len(types)):
        o = per_layer.get(str(i)) or per_layer.get(i) or {}
        out.append((int(o.get("head_dim", head_dim)), int(o.get("num_key_value_heads", kv_heads))))
    return tuple(out)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: Gemma4Config, layer_id: int, comm: DistributedCommunicator,
                 moe: BaseMoeBackend) -> None:
        super().__init__()
        sliding = cfg.layer_types[layer_id] == "sliding_attention"
        head_dim, kv_heads = cfg.layer_attn[layer_id]
        if sliding:
            rotary = RotaryConfig(head_dim, cfg.local_rope_base, cfg.max_position)
        else:  # the first global_rope_fraction of the frequencies turn, over the whole head
            rotary = RotaryConfig(head_dim, cfg.global_rope_base, cfg.max_position, scaling=(
                ("partial_rotary_factor", cfg.global_rope_fraction), ("rope_type", "proportional")))
        self.self_attn = AttentionLayer(
            cfg, layer_id, comm, head_dim=head_dim, num_kv_heads=kv_heads, scale=1.0,
            sliding_window=cfg.sliding_window if sliding else None,
            logit_softcap=cfg.attn_logit_softcap, rotary=RotaryEmbedding(rotary),
            norm=functools.partial(RMSNorm, fp32=True),
            v_norm=functools.partial(RMSNorm, scale=False),
        )
        self.mlp = GatedMLP.from_config(cfg, comm)
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        names = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"]
        if cfg.moe_block:
            names += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                      "pre_feedforward_layernorm_2"]
            spec = MoESpec(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
                           router_scales=True, act=MoeActivation("gelu_tanh"))
            self.moe = MoELayer(cfg, comm, moe, cfg.quant, spec)
        for name in names:
            setattr(self, name, RMSNorm(h, eps, fp32=True))
        self.layer_scalar = new_param(1)
        self.has_moe = cfg.moe_block

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        h = self.self_attn(self.input_layernorm(x), positions, ctx)
        x = self.post_attention_layernorm.add_to(x, h)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if self.has_moe:  # the router reads the stream before the MLP, the experts its norm
            experts = self.moe(self.pre_feedforward_layernorm_2(x), router_input=x)
            h = self.post_feedforward_layernorm_2.add_to(self.post_feedforward_layernorm_1(h),
                                                      experts)
        return self.post_feedforward_layernorm.add_to(x, h, self.layer_scalar)


class Gemma4ForCausalLM(Gemma3ForCausalLM):
    """Gemma 3's model (embedding scale, final soft-cap, checkpoint shapes) with Gemma 4's layer,
    fp32 (w) norms and names."""

    cfg: Gemma4Config
    norm_options = {"fp32": True}
    names = NAMES

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        return parse_gemma4(raw)

    def make_layer(self, cfg: Gemma4Config, layer_id: int, comm: DistributedCommunicator,
                   moe: BaseMoeBackend) -> nn.Module:
        return Gemma4DecoderLayer(cfg, layer_id, comm, moe)

    def expand_tensor(self, name: str, tensor: Any) -> Iterator[tuple[str, Any]]:
        """K = V layers: the checkpoint's ``k_proj`` also fills the v rows of the merged
        projection."""
        yield name, tensor
        mapped = self.checkpoint_names(name)
        if mapped is not None and mapped[1] == "k" and self.cfg.k_eq_v:
            layer = int(mapped[0].split(".")[1])
            if self.cfg.layer_types[layer] == "full_attention":
                yield name.replace(".k_proj.", ".v_proj."), tensor

    @classmethod
    def checkpoint_shapes(cls, cfg: Gemma4Config) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Dummy weights: the tensors of a Gemma 4 text checkpoint."""
        h = cfg.hidden_size
        yield "model.embed_tokens.weight", (cfg.vocab_size, h)
        yield "model.norm.weight", (h,)
        for i, kind in enumerate(cfg.layer_types):
            p = f"model.layers.{i}."
            full = kind == "full_attention"
            d, kv = cfg.layer_attn[i]
            kv *= d
            yield p + "self_attn.q_proj.weight", (cfg.num_qo_heads * d, h)
            yield p + "self_attn.k_proj.weight", (kv, h)
            if not (full and cfg.k_eq_v):
                yield p + "self_attn.v_proj.weight", (kv, h)
            yield p + "self_attn.o_proj.weight", (h, cfg.num_qo_heads * d)
            yield p + "self_attn.q_norm.weight", (d,)
            yield p + "self_attn.k_norm.weight", (d,)
            for proj, shape in (("gate", (cfg.intermediate_size, h)),
                                ("up", (cfg.intermediate_size, h)),
                                ("down", (h, cfg.intermediate_size))):
                yield p + f"mlp.{proj}_proj.weight", shape
            norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"]
            if cfg.moe_block:
                e, inter = cfg.num_experts, cfg.moe_intermediate_size
                norms += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                          "pre_feedforward_layernorm_2"]
                yield p + "router.proj.weight", (e, h)
                yield p + "router.scale", (h,)
                yield p + "router.per_expert_scale", (e,)
                yield p + "experts.gate_up_proj", (e, 2 * inter, h)
                yield p + "experts.down_proj", (e, h, inter)
            for norm in norms:
                yield p + f"{norm}.weight", (h,)
            yield p + "layer_scalar", (1,)


class Gemma4ForConditionalGeneration(Gemma4ForCausalLM):
    """The multimodal checkpoint (its ``text_config``, its language model; the vision tower runs
    in the engine, ``engine/images.py``). With ``use_bidirectional_attention: "vision"`` an
    image's tokens attend to each other both ways in the sliding layers only (transformers'
    ``create_masks_for_vision_model``: the global layers stay causal)."""

    def __init__(self, cfg: Gemma4Config, comm: DistributedCommunicator,
                 moe: BaseMoeBackend) -> None:
        super().__init__(cfg, comm, moe)
        if cfg.raw.get("use_bidirectional_attention") == "vision":
            for layer, kind in zip(self.layers, cfg.layer_types):
                if kind == "sliding_attention":
                    attn = layer.self_attn
                    attn.spec = dataclasses.replace(attn.spec, image_blocks=True)

