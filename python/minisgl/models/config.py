"""Model configuration read from a Hugging Face ``config.json`` dict.

``ModelConfig.from_dict`` hands the dict to the parser of the family its ``architectures`` entry
names (each model file's ``parse_config``); ``common_fields`` is what they share. Both
transformers-4 and transformers-5 spellings are accepted: ``rope_theta``/``rope_scaling`` versus
``rope_parameters``, ``torch_dtype`` versus ``dtype``, ``num_experts`` versus ``num_local_experts``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from minisgl.quant import QuantizationConfig, config_from_checkpoint


@dataclass(frozen=True)
class RotaryConfig:
    head_dim: int
    base: float
    max_position: int
    # sorted (key, value) pairs, e.g. (("factor", 8.0), ("rope_type", "llama3"), ...): hashable
    scaling: tuple[tuple[str, Any], ...] | None = None
    # Qwen's multimodal rotary (``multimodal/mrope.py``): (mrope_section, mrope_interleaved)
    mrope: tuple[tuple[int, ...], bool] | None = None


@dataclass(frozen=True)
class LinearAttnConfig:
    """A Gated DeltaNet layer of the whole model (before tensor parallelism)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v heads side by side."""
        return 2 * self.num_key_heads * self.key_head_dim + self.value_size

    @property
    def value_size(self) -> int:
        return self.num_value_heads * self.value_head_dim


@dataclass(frozen=True)
class HybridConfig:
    """What a hybrid (Gated DeltaNet / gated attention) decoder adds to ``ModelConfig``."""

    layer_types: tuple[str, ...]  # "linear_attention" or "full_attention" per layer
    linear: LinearAttnConfig
    rotary_fraction: float = 1.0  # the head dims the gated attention rotates
    shared_expert_intermediate_size: int = 0
    mtp_layers: int = 0  # the checkpoint's multi-token-prediction layers (``models/mtp.py``)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> HybridConfig:
        n = cfg["num_hidden_layers"]
        types = cfg.get("layer_types")
        if types is None:  # every full_attention_interval-th layer is full attention
            interval = cfg.get("full_attention_interval", 4)
            types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(n)]
        if len(types) != n or set(types) - {"full_attention", "linear_attention"}:
            raise ValueError(f"layer_types: expected {n} of full_attention/linear_attention")
        linear = LinearAttnConfig(cfg["linear_num_key_heads"], cfg["linear_num_value_heads"],
                                  cfg["linear_key_head_dim"], cfg["linear_value_head_dim"],
                                  cfg["linear_conv_kernel_dim"])
        if linear.num_value_heads % linear.num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        fraction = (cfg.get("rope_parameters") or {}).get(
            "partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        return cls(tuple(types), linear, float(fraction),
                   cfg.get("shared_expert_intermediate_size") or 0,
                   cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0)

    def index(self, layer_id: int) -> int:
        """The layer's index among the layers of its own kind (KV layers, state layers)."""
        return self.layer_types[:layer_id].count(self.layer_types[layer_id])

    def count(self, kind: str) -> int:
        return self.layer_types.count(kind)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rotary: RotaryConfig
    tie_word_embeddings: bool
    max_position: int
    hidden_act: str = "silu"
    attention_bias: bool = False
    qk_norm: bool = False
    dtype: torch.dtype = torch.bfloat16
    eos_token_ids: tuple[int, ...] = ()
    # MoE (Qwen3-MoE); num_experts == 0 means dense
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    mlp_only_layers: tuple[int, ...] = ()
    decoder_sparse_step: int = 1
    hybrid: HybridConfig | None = None  # Qwen3-Next / Qwen3.5 / Qwen3.6
    # the weight format: the checkpoint's quantization_config (None: unquantized); the engine
    # resolves it with the quantization option and the kernel switches (never None there)
    quant: QuantizationConfig | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_sparse_layer(self, layer_id: int) -> bool:
        return (
            self.is_moe
            and layer_id not in self.mlp_only_layers
            and (layer_id + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Parsed by the family its ``architectures`` entry names (``registry``)."""
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry")
        from .registry import get_model_class

        return get_model_class(archs[0]).parse_config(cfg)

    @classmethod
    def from_path(cls, model_dir: str) -> ModelConfig:
        with open(os.path.join(model_dir, "config.json")) as f:
            return cls.from_dict(json.load(f))


def common_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The fields every decoder-only family reads the same way, as ``ModelConfig`` keywords; a
    family's parser adds its own (``attention_bias``, ``qk_norm``, the MoE fields)."""
    hidden = cfg["hidden_size"]
    num_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // num_heads
    max_pos = cfg.get("max_position_embeddings", 4096)
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    dtype_name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    return dict(
        architecture=cfg["architectures"][0],
        model_type=cfg.get("model_type", ""),
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        intermediate_size=cfg.get("intermediate_size", 0),
        num_layers=cfg["num_hidden_layers"],
        num_qo_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rotary=rotary_config(cfg, head_dim, max_pos),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position=max_pos,
        hidden_act=cfg.get("hidden_act", "silu"),
        attention_bias=bool(cfg.get("attention_bias", False)),
        dtype=getattr(torch, dtype_name) if isinstance(dtype_name, str) else dtype_name,
        eos_token_ids=eos_ids,
        quant=config_from_checkpoint(cfg),
        raw=cfg,
    )


def rotary_config(cfg: dict[str, Any], head_dim: int, max_pos: int) -> RotaryConfig:
    """RoPE from ``rope_theta``/``rope_scaling`` (transformers 4) or ``rope_parameters`` (5)."""
    rope_params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or None
    base = rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if scaling is None and rope_params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
    section = rope_params.get("mrope_section") or (scaling or {}).get("mrope_section")
    mrope = None
    if section:
        interleaved = rope_params.get("mrope_interleaved", (scaling or {}).get(
            "mrope_interleaved", False))
        mrope = (tuple(int(n) for n in section), bool(interleaved))
    if scaling is not None:
        scaling = {k: v for k, v in scaling.items() if not k.startswith("mrope_")}
        scaling.setdefault("rope_type", scaling.get("type", "default"))
        if scaling["rope_type"] in ("default", "mrope"):
            scaling = None
        else:
            scaling = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                   for k, v in scaling.items()))
    return RotaryConfig(head_dim, float(base), max_pos, scaling, mrope)


def load_eos_token_ids(model_dir: str, tokenizer=None) -> tuple[int, ...]:
    """Every EOS id of ``config.json``, ``generation_config.json`` (instruct models add some) and
    the tokenizer."""
    ids: list[int] = []
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(model_dir, name)
        if os.path.isfile(path):
            with open(path) as f:
                eos = json.load(f).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
    return tuple(sorted(set(ids)))


def eos_token_ids(model_dir: str) -> tuple[int, ...]:
    """``load_eos_token_ids`` for a process that needs only the ids (a scheduler): the
    tokenizer's read from its files where they settle it, so that transformers' import and the
    tokenizer's load (seconds, beside the other processes' own) stay off its start-up."""
    from minisgl.utils.hf import load_tokenizer, tokenizer_eos_ids

    tokenizer_ids = tokenizer_eos_ids(model_dir)
    if tokenizer_ids is None:
        return load_eos_token_ids(model_dir, load_tokenizer(model_dir))
    return tuple(sorted({*tokenizer_ids, *load_eos_token_ids(model_dir)}))
