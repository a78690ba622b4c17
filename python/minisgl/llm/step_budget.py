"""The default token budget of a mixed step on a GPU, sized by the compute of the served model.

A mixed step is as long as its prefill chunk's matrix work, and every running stream waits for it,
so the budget is a compute budget: the tokens whose weight multiplications cost about as much as a
1024-token chunk of Qwen3-8B (~7e9 matmul weights; with 64 streams decoding beside such chunks on an
H100 the P99 gap between tokens was 50 ms and the largest 135 ms, where prefill-first paused them
for over a second). A small model gets proportionally more tokens: the fixed cost of an eager step
(kernel launches, scheduling) then stays small next to the chunk, which on Qwen3-0.6B at 1024
tokens cost a third of the throughput (at 8192: 0.98x of prefill-first).
"""

from __future__ import annotations

import json
import math
import os

_STEP_WEIGHT_TOKENS = 7.0e9 * 1024  # matmul weights x tokens of one step: 1024 tokens of an 8B model
# below 1024 a Qwen3-8B server at 64 streams lost throughput (768: 0.81x, 512: 0.6x of prefill-first):
# an eager step lasts at least the host's launch of it (17-35 ms), so more, smaller chunks cost more
MIN_BUDGET = 1024
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


def gpu_step_budget(model_path: str, cap: int) -> int:
    """A power of two between ``MIN_BUDGET`` and ``cap`` (``max_prefill_tokens``)."""
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            weights = matmul_weights_per_token(json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
        return min(FALLBACK_BUDGET, cap)
    tokens = 2 ** round(math.log2(_STEP_WEIGHT_TOKENS / max(weights, 1)))
    return max(min(tokens, cap), min(MIN_BUDGET, cap))
