"""An EAGLE-3 draft's ``config.json`` (the draft: ``models/eagle3.py``), read and checked against
its target's: a bad draft is a ``ValueError`` naming its field. ``EngineOptions.scheduler_config``
reads it first, so the error comes before any rank starts; ``load_eagle3`` reads it again to build
the draft.

Which target layers: ``eagle_config.eagle_aux_hidden_state_layer_ids`` counts layer outputs
(SGLang's reading); a top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM's speculators layout)
counts layer inputs, so id j is the output of layer j - 1; with neither, the outputs of layers
1, L/2 - 1 and L - 4 (the inputs of 2, L/2 and L - 3, both engines' default).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from .config import ModelConfig, RotaryConfig, rotary_config

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
# the option a draft's errors name
FIELD = "speculative_config.model (--speculative-draft-model-path)"


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    eps: float
    rotary: RotaryConfig
    vocab_size: int
    draft_vocab_size: int
    aux_layers: tuple[int, ...]  # the target layers whose outputs ``fc`` reads, in order
    tie_word_embeddings: bool = False
    norm_before_residual: bool = False
    fc_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False


def read_config(path: str, target: ModelConfig) -> Eagle3Config:
    """The draft's config, checked against the target's: a ``ValueError`` naming the field."""
    file = os.path.join(path, "config.json")
    try:
        with open(file) as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{FIELD}: cannot read an EAGLE-3 draft's config.json in the local "
                         f"directory {path!r} ({e.__class__.__name__}; Hugging Face repo ids "
                         "are not downloaded for drafts)") from None
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if not isinstance(raw.get(key), int):
            raise ValueError(f"{key}: missing from the EAGLE-3 draft's config.json ({path!r})")
    archs = raw.get("architectures") or []
    if not set(archs) & set(ARCHITECTURES):
        raise ValueError(f"{FIELD}: architectures {archs} is not an EAGLE-3 draft "
                         f"({' or '.join(ARCHITECTURES)})")
    eagle = raw.get("eagle_config") or {}
    if not eagle.get("use_aux_hidden_state", True):
        raise ValueError("eagle_config.use_aux_hidden_state: false (an EAGLE-1/2 draft on the "
                         "last hidden state) is not supported; EAGLE-3 drafts read aux states")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act: {raw['hidden_act']!r} is not supported (silu)")
    if raw.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"num_hidden_layers: the draft has {raw['num_hidden_layers']} layers; "
                         "only one-layer EAGLE-3 drafts are supported")
    target_hidden = raw.get("target_hidden_size") or raw["hidden_size"]
    if target_hidden != target.hidden_size:
        raise ValueError(f"target_hidden_size: the draft reads hidden states of {target_hidden} "
                         f"features, the target has {target.hidden_size}")
    if raw.get("vocab_size") != target.vocab_size:
        raise ValueError(f"vocab_size: the draft's {raw.get('vocab_size')} is not the target's "
                         f"{target.vocab_size}")
    draft_vocab = raw.get("draft_vocab_size") or raw["vocab_size"]
    if not 0 < draft_vocab <= target.vocab_size:
        raise ValueError(f"draft_vocab_size: {draft_vocab} must be in [1, {target.vocab_size}]")
    if raw.get("tie_word_embeddings") and draft_vocab != raw["vocab_size"]:
        raise ValueError(f"tie_word_embeddings: an LM head tied to the embedding predicts the "
                         f"whole vocabulary, not draft_vocab_size {draft_vocab}")
    layers = aux_layers(raw, target.num_layers)
    if len(set(layers)) != len(layers) or not all(0 <= i < target.num_layers for i in layers):
        raise ValueError(f"eagle_aux_hidden_state_layer_ids: the draft reads target layers "
                         f"{list(layers)}, which must be distinct layers of the target's "
                         f"{target.num_layers}")
    heads = raw["num_attention_heads"]
    head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
    return Eagle3Config(
        hidden_size=raw["hidden_size"], target_hidden_size=target_hidden, num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads, head_dim=head_dim,
        intermediate_size=raw["intermediate_size"], eps=raw.get("rms_norm_eps", 1e-6),
        # NOTE: drafts often declare a shorter context than their target's (2048): RoPE is
        # defined at every position, and the cos/sin table must cover the target's
        rotary=rotary_config(raw, head_dim, max(raw.get("max_position_embeddings", 4096),
                                                target.max_position)),
        vocab_size=raw["vocab_size"], draft_vocab_size=draft_vocab,
        aux_layers=layers,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        norm_before_residual=bool(raw.get("norm_before_residual", False)),
        fc_bias=bool(raw.get("bias", False)), attention_bias=bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)))


def aux_layers(raw: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """The target layers whose outputs the draft reads (the module docstring says whose
    convention), unchecked."""
    ids = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is not None:
        return tuple(int(i) for i in ids)
    if raw.get("eagle_aux_hidden_state_layer_ids") is not None:
        return tuple(int(i) - 1 for i in raw["eagle_aux_hidden_state_layer_ids"])
    return (1, num_layers // 2 - 1, num_layers - 4)
