"""Qwen3-Next (``Qwen3NextForCausalLM``): a hybrid decoder, three Gated DeltaNet layers for each
gated full-attention layer (``layer_types``, or every ``full_attention_interval``-th layer), each
followed by an MoE with a gated shared expert (or a dense MLP).

The model owns two caches: the paged KV pool of its full-attention layers only (``num_kv_layers``)
and the state pool of its linear layers (``state_shape`` per slot, ``num_linear_layers``). The MTP
head of the checkpoints is not loaded (speculative decoding is not supported); loading says so.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Iterable, Iterator

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.kvcache.spec import CacheSpec
from minisgl.kvcache.state_pool import StateShape
from minisgl.layers import ParallelLMHead, VocabParallelEmbedding
from minisgl.layers.linear_attention import GatedDeltaNet, SplitColumnLinear
from minisgl.moe import BaseMoeBackend
from minisgl.utils import init_logger

from .base import BaseLLMModel
from .config import ModelConfig, RotaryConfig, common_fields
from .hybrid import DenseMLP, FusedOffsetRMSNorm, GatedAttention, SharedExpertMoE

if TYPE_CHECKING:
    from minisgl.context import Context

logger = init_logger(__name__)


def layer_types(raw: dict) -> list[str]:
    n = raw["num_hidden_layers"]
    types = raw.get("layer_types")
    if types is None:
        interval = raw.get("full_attention_interval", 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(n)]
    if len(types) != n or set(types) - {"full_attention", "linear_attention"}:
        raise ValueError(f"layer_types: expected {n} of full_attention/linear_attention")
    return list(types)


def partial_rotary(cfg: ModelConfig) -> RotaryConfig:
    raw = cfg.raw
    factor = (raw.get("rope_parameters") or {}).get("partial_rotary_factor",
                                                     raw.get("partial_rotary_factor", 1.0))
    return dataclasses.replace(cfg.rotary, head_dim=int(cfg.head_dim * factor))


class Qwen3NextGatedDeltaNet(GatedDeltaNet):
    """Fused projections laid out per key head: ``in_proj_qkvz`` rows are, for each key head, its
    q, k, the v of its value heads and their z; ``in_proj_ba`` likewise b then a. A rank's key
    heads are consecutive rows, so each is one part split evenly."""

    def __init__(self, cfg: dict, state_index: int, comm: DistributedCommunicator, quant) -> None:
        super().__init__(cfg, state_index, comm, quant)
        hk, rep = cfg["linear_num_key_heads"], self.num_v_heads // self.num_k_heads
        group = 2 * self.k_dim + 2 * rep * self.v_dim
        self.in_proj_qkvz = SplitColumnLinear(cfg["hidden_size"], [hk * group], comm, quant)
        self.in_proj_ba = SplitColumnLinear(cfg["hidden_size"], [hk * 2 * rep], comm)
        self.rep = rep

    def project(self, x: torch.Tensor):
        t, r = x.shape[0], self.rep
        qkvz = self.in_proj_qkvz(x).view(t, self.num_k_heads, -1)
        q, k, v, z = qkvz.split([self.k_dim, self.k_dim, r * self.v_dim, r * self.v_dim], dim=-1)
        qkv = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        b, a = self.in_proj_ba(x).view(t, self.num_k_heads, 2 * r).split([r, r], dim=-1)
        return (qkv, z.reshape(t, self.num_v_heads, self.v_dim), b.reshape(t, -1),
                a.reshape(t, -1))


class HybridDecoderLayer(nn.Module):
    def __init__(self, model: HybridModel, layer_id: int, comm: DistributedCommunicator,
                 moe: BaseMoeBackend) -> None:
        super().__init__()
        cfg = model.cfg
        self.is_linear = model.layer_types[layer_id] == "linear_attention"
        if self.is_linear:
            self.linear_attn = model.linear_cls(cfg.raw, model.state_index[layer_id], comm,
                                                cfg.quant)
        else:
            self.self_attn = GatedAttention(cfg, model.rotary, model.kv_index[layer_id], comm)
        if cfg.is_sparse_layer(layer_id):
            shared = cfg.raw.get("shared_expert_intermediate_size", 0)
            self.mlp = SharedExpertMoE(cfg, shared, comm, moe)
        else:
            self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, comm, cfg.quant)
        self.input_layernorm = FusedOffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = FusedOffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm(x, residual)
        x = self.linear_attn(x, ctx) if self.is_linear else self.self_attn(x, positions, ctx)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


# checkpoint name (prefix removed) -> (our name, shard id)
_RULES: list[tuple[re.Pattern, str, object]] = [
    (re.compile(r"(.*)\.self_attn\.([qkv])_proj\.(weight|bias|weight_scale_inv)$"),
     r"\1.self_attn.qkv_proj.\3", "qkv"),
    (re.compile(r"(.*)\.mlp\.shared_expert\.gate_proj\.(weight|weight_scale_inv)$"),
     r"\1.mlp.shared_expert.gate_up_proj.\2", 0),
    (re.compile(r"(.*)\.mlp\.shared_expert\.up_proj\.(weight|weight_scale_inv)$"),
     r"\1.mlp.shared_expert.gate_up_proj.\2", 1),
    (re.compile(r"(.*)\.mlp\.shared_expert_gate\.weight$"), r"\1.mlp.shared_expert_gate", None),
    (re.compile(r"(.*)\.mlp\.gate\.weight$"), r"\1.mlp.experts.gate.weight", None),
    (re.compile(r"(.*)\.mlp\.gate_proj\.(weight|weight_scale_inv)$"), r"\1.mlp.gate_up_proj.\2", 0),
    (re.compile(r"(.*)\.mlp\.up_proj\.(weight|weight_scale_inv)$"), r"\1.mlp.gate_up_proj.\2", 1),
    (re.compile(r"(.*)\.linear_attn\.conv1d\.weight$"), r"\1.linear_attn.conv1d_weight", None),
    (re.compile(r"(.*)\.linear_attn\.norm\.weight$"), r"\1.linear_attn.norm_weight", None),
]
_EXPERT = re.compile(r"(.*)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|weight_scale_inv)$")
_FUSED_EXPERTS = re.compile(r"(.*)\.mlp\.experts\.(gate_up_proj|down_proj)$")


class HybridModel(BaseLLMModel):
    """The decoder of every hybrid family; subclasses set the checkpoint conventions."""

    linear_cls: type[GatedDeltaNet] = Qwen3NextGatedDeltaNet
    prefix = "model."
    # checkpoint parts that are not the text model: skipped, and loading says so
    skipped = {"mtp.": "the multi-token-prediction head (speculative decoding is not supported)"}
    # checkpoint projection name -> (our SplitColumnLinear, its part ids)
    split_projs = {"in_proj_qkvz": ("in_proj_qkvz", (0,)), "in_proj_ba": ("in_proj_ba", (0,))}

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
        )

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator,
                 moe: BaseMoeBackend) -> None:
        nn.Module.__init__(self)  # not BaseLLMModel's: the layers are built here
        self.cfg = cfg
        self.layer_types = layer_types(cfg.raw)
        self.kv_index = {i: n for n, i in enumerate(
            i for i, t in enumerate(self.layer_types) if t == "full_attention")}
        self.state_index = {i: n for n, i in enumerate(
            i for i, t in enumerate(self.layer_types) if t == "linear_attention")}
        self.rotary = partial_rotary(cfg)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, comm)
        self.layers = nn.ModuleList(HybridDecoderLayer(self, i, comm, moe)
                                    for i in range(cfg.num_layers))
        self.norm = FusedOffsetRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        tied = self.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, comm, tied=tied,
                                      quant=cfg.quant)
        attn = next(layer.self_attn for layer in self.layers if not layer.is_linear)
        lin = next(layer.linear_attn for layer in self.layers if layer.is_linear)
        self.num_kv_layers, self.num_linear_layers = len(self.kv_index), len(self.state_index)
        self.local_kv_heads = attn.qkv_proj.local_kv
        self.state_shape = StateShape(lin.conv_dim, lin.conv_width, lin.num_v_heads, lin.k_dim,
                                      lin.v_dim)

    def cache_spec(self) -> CacheSpec:
        """KV for the gated-attention layers, a state slot per linear layer."""
        return CacheSpec(tuple(layer.self_attn.spec for layer in self.layers
                               if not layer.is_linear), self.state_shape, self.num_linear_layers)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: Context) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        return self.norm(x, residual)[0]

    def checkpoint_names(self, name: str) -> tuple[str, object] | None:
        for skip in self.skipped:
            if name.startswith(skip):
                return None
        if name.startswith(self.prefix):
            name = name[len(self.prefix):]
        elif not name.startswith("lm_head."):
            return None
        if name.startswith("lm_head.") and self.cfg.tie_word_embeddings:
            return None
        for pattern, target, shard in _RULES:
            match = pattern.match(name)
            if match:
                return match.expand(target), match.group(2) if shard == "qkv" else shard
        match = re.match(r"(.*)\.linear_attn\.(\w+)\.(weight|weight_scale_inv)$", name)
        if match and match.group(2) in self.split_projs:
            ours, ids = self.split_projs[match.group(2)]
            return f"{match.group(1)}.linear_attn.{ours}.{match.group(3)}", ids
        match = _EXPERT.match(name)
        if match:
            prefix, expert, kind = match.group(1), int(match.group(2)), match.group(3)
            suffix = "_scale_inv" if match.group(4) == "weight_scale_inv" else ""
            if kind == "down":
                return f"{prefix}.mlp.experts.w2{suffix}", expert
            return f"{prefix}.mlp.experts.w13{suffix}", (expert, 0 if kind == "gate" else 1)
        return name, None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        seen: set[str] = set()

        def stream() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                for skip, what in self.skipped.items():
                    if name.startswith(skip) and skip not in seen:
                        seen.add(skip)
                        logger.info("not loaded: %s (%s*)", what, skip)
                yield from _unfuse_experts(name, tensor)

        super().load_weights(stream())
        # the KV pool holds the full-attention layers only: its scales go by their index
        self.kv_scales = {self.kv_index[i]: s for i, s in self.kv_scales.items()
                          if i in self.kv_index}

    @classmethod
    def checkpoint_shapes(cls, cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Names and full shapes of a checkpoint of ``cfg`` (for ``--dummy-weights``)."""
        raw, h, d = cfg.raw, cfg.hidden_size, cfg.head_dim
        hk, hv = raw["linear_num_key_heads"], raw["linear_num_value_heads"]
        dk, dv, w = raw["linear_key_head_dim"], raw["linear_value_head_dim"], \
            raw["linear_conv_kernel_dim"]
        p = cls.prefix
        yield p + "embed_tokens.weight", (cfg.vocab_size, h)
        if not cfg.tie_word_embeddings:
            yield "lm_head.weight", (cfg.vocab_size, h)
        yield p + "norm.weight", (h,)
        for i, kind in enumerate(layer_types(raw)):
            q = p + f"layers.{i}."
            yield q + "input_layernorm.weight", (h,)
            yield q + "post_attention_layernorm.weight", (h,)
            if kind == "full_attention":
                a = q + "self_attn."
                yield a + "q_proj.weight", (2 * cfg.num_qo_heads * d, h)
                yield a + "k_proj.weight", (cfg.num_kv_heads * d, h)
                yield a + "v_proj.weight", (cfg.num_kv_heads * d, h)
                yield a + "o_proj.weight", (h, cfg.num_qo_heads * d)
                yield a + "q_norm.weight", (d,)
                yield a + "k_norm.weight", (d,)
            else:
                a = q + "linear_attn."
                yield from ((a + n, s) for n, s in cls.linear_shapes(h, hk, hv, dk, dv))
                yield a + "conv1d.weight", (2 * hk * dk + hv * dv, 1, w)
                yield a + "dt_bias", (hv,)
                yield a + "A_log", (hv,)
                yield a + "norm.weight", (dv,)
                yield a + "out_proj.weight", (h, hv * dv)
            m = q + "mlp."
            if cfg.is_sparse_layer(i):
                inter, shared = cfg.moe_intermediate_size, raw["shared_expert_intermediate_size"]
                yield m + "gate.weight", (cfg.num_experts, h)
                for e in range(cfg.num_experts):
                    yield m + f"experts.{e}.gate_proj.weight", (inter, h)
                    yield m + f"experts.{e}.up_proj.weight", (inter, h)
                    yield m + f"experts.{e}.down_proj.weight", (h, inter)
                yield m + "shared_expert.gate_proj.weight", (shared, h)
                yield m + "shared_expert.up_proj.weight", (shared, h)
                yield m + "shared_expert.down_proj.weight", (h, shared)
                yield m + "shared_expert_gate.weight", (1, h)
            else:
                yield m + "gate_proj.weight", (cfg.intermediate_size, h)
                yield m + "up_proj.weight", (cfg.intermediate_size, h)
                yield m + "down_proj.weight", (h, cfg.intermediate_size)

    @staticmethod
    def linear_shapes(h: int, hk: int, hv: int, dk: int, dv: int):
        yield "in_proj_qkvz.weight", (2 * hk * dk + 2 * hv * dv, h)
        yield "in_proj_ba.weight", (2 * hv, h)


def _unfuse_experts(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Experts stored as one ``[E, ...]`` tensor (``experts.gate_up_proj``: ``[E, 2I, H]``,
    ``experts.down_proj``: ``[E, H, I]``) become the per-expert tensors the loader maps."""
    match = _FUSED_EXPERTS.search(name)
    if not match:
        yield name, tensor
        return
    full = tensor.load() if hasattr(tensor, "load") else tensor
    prefix = match.group(1)
    for e in range(full.shape[0]):
        if match.group(2) == "down_proj":
            yield f"{prefix}.mlp.experts.{e}.down_proj.weight", full[e]
        else:
            gate, up = full[e].chunk(2, dim=0)
            yield f"{prefix}.mlp.experts.{e}.gate_proj.weight", gate
            yield f"{prefix}.mlp.experts.{e}.up_proj.weight", up


class Qwen3NextForCausalLM(HybridModel):
    pass
