"""The default token budget of a mixed step on a GPU, sized by the compute of the served model.

A mixed step is as long as its prefill chunk's matrix work, and every running stream waits for it,
so the budget is a compute budget: the tokens whose weight multiplications cost about as much as
``STEP_TOKENS_8B`` tokens of Qwen3-8B (~7e9 matmul weights per token): the budget that kept the
P99 gap between tokens near twice the median without delaying first tokens much. A small model
gets proportionally more tokens, up to the largest forward that replays piecewise graphs: a step
beyond them is eager, and its launch alone costs more host time than the graphs save. Without
piecewise graphs every mixed step is eager, and small budgets lose throughput: more, smaller
chunks mean more launches. The measurements: docs/performance.md, "Measurements behind the code".
"""

from __future__ import annotations

import json
import math
import os

_WEIGHTS_8B = 7.0e9  # matmul weights per token of Qwen3-8B
STEP_TOKENS_8B = 640  # with piecewise graphs (a multiple of 128 for other models)
EAGER_TOKENS_8B = 1024  # without (a power of two for other models, and at least this)
FALLBACK_BUDGET = 2048  # a config this estimate does not understand


def matmul_weights_per_token(config: dict) -> int:
    """Weights one token multiplies through the decoder layers (attention projections and the
    experts it is routed to; embeddings and the LM head, which prefill runs for the last token
    only, excluded)."""
    config = config.get("text_config", config)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    if config.get("num_experts_per_tok"):
        inter = config["moe_intermediate_size"] * config["num_experts_per_tok"]
        inter += config.get("shared_expert_intermediate_size") or 0
    else:
        inter = config["intermediate_size"]
    return layers * (attention + 3 * hidden * inter)


def gpu_step_budget(model_path: str | None, cap: int, graph_tokens: int = 0) -> int:
    """The budget for the model at ``model_path``, at most ``cap`` (``max_prefill_tokens``);
    ``graph_tokens``: the largest forward with piecewise CUDA graphs (0: none). A model whose
    config is unknown (no path, or one this estimate does not understand) gets
    ``FALLBACK_BUDGET``."""
    if graph_tokens:
        cap = min(cap, graph_tokens)
    weights = _config_weights(model_path)
    if weights is None:
        return min(FALLBACK_BUDGET, cap)
    if graph_tokens:
        tokens = max(128, round(_WEIGHTS_8B * STEP_TOKENS_8B / weights / 128) * 128)
        return min(tokens, cap)
    tokens = 2 ** round(math.log2(_WEIGHTS_8B * EAGER_TOKENS_8B / weights))
    return max(min(tokens, cap), min(EAGER_TOKENS_8B, cap))


def _config_weights(model_path: str | None) -> int | None:
    if model_path is None:
        return None
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            return max(matmul_weights_per_token(json.load(f)), 1)
    except (OSError, ValueError, KeyError, TypeError):
        return None
