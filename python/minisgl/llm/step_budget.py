"""The default token budget of a mixed step on a GPU, sized by the compute of the served model.

A mixed step is as long as its prefill chunk's matrix work, and every running stream waits for it,
so the budget is a compute budget: the tokens whose weight multiplications cost about as much as
``STEP_TOKENS_8B`` tokens of Qwen3-8B (~7e9 matmul weights per token). On an H100 with 64 streams
and piecewise CUDA graphs, the server's P99 gap between tokens over its median was 2.18-2.20 at 640
tokens with a mean time to first token 1.11-1.15x prefill-first's, where 768 tokens gave 2.67 on
the same machine (2.49-3.67 on five) and 512 tokens 1.69 but 1.22x; a slower host gave 3.07 at 640.
A small model gets proportionally more tokens, up to the largest forward that replays piecewise
graphs: a step beyond them is eager, and its launch alone costs 14-35 ms of host time (Qwen3-0.6B
at 2048 tokens with graphs up to 1024: 0.84x of prefill-first's throughput; with graphs up to 4096,
4096 tokens: 1.035x, the largest gap 30 ms).

Without piecewise graphs every mixed step is eager, and budgets below 1024 tokens of an 8B model
lost throughput (768: 0.81x, 512: 0.6x of prefill-first): more, smaller chunks mean more launches.
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
