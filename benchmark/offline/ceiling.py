"""The bandwidth ceiling of the offline workload: the output tok/s a GPU would reach if every decode
step only streamed its bytes at peak HBM bandwidth and every prefill only ran its matmuls at peak
tensor throughput, with no CPU overhead and no kernel below its roofline.

A decode step of ``B`` running requests reads
  - the weights once (every layer and the LM head; the embedding gives B rows only; MXFP4 experts
    at 4.25 bits a weight: a byte per two values, one scale byte per 32); of the routed experts
    only those its B tokens route to, expected under uniform routing (``experts_touched``),
  - each request's KV cache of its full-attention layers (its context so far) and of its sliding
    layers (the last ``sliding_window`` tokens of it),
  - each request's recurrent state of its linear-attention layers, **twice** (read, then written
    back: the delta-rule state in its dtype and the conv window in the model's dtype),
and the workload's requests all run together from the start (256 requests fit every pool of
these models), each leaving after its ``max_tokens``. Prefill adds ``2 * parameters`` FLOPs per
prompt token plus the causal attention of its full-attention layers.

Peak figures: HBM 3.35 TB/s (H100 SXM) / 4.8 TB/s (H200), bf16 matmuls 790 TFLOP/s (what a
large GEMM measures on both). This reproduces the ceilings docs/performance.md quotes for dense
models (Qwen3-8B 10.7k on an H100 against the quoted 10.5k) and extends them to hybrid ones.
"""

from __future__ import annotations

BANDWIDTH = {"H100": 3.35e12, "H200": 4.8e12}
MATMUL_FLOPS = 790e12
MXFP4_BYTES = 17 / 32  # per weight: 16 bytes of e2m1 pairs and one e8m0 scale per 32 values


def _text(raw: dict) -> dict:
    """The text model's fields, with transformers' defaults for those ``config.json`` leaves out
    (Gemma 3's text config omits ``vocab_size``), as loading reads them."""
    text = raw.get("text_config") or raw
    try:
        from transformers import AutoConfig

        fields = {k: v for k, v in raw.items() if k != "model_type"}
        defaults = AutoConfig.for_model(raw["model_type"], **fields).get_text_config().to_dict()
    except (ImportError, KeyError, ValueError):  # no transformers, or a type it lacks
        defaults = {}
    return {**defaults, **text}


def experts_touched(raw: dict, batch: int) -> float:
    """Routed experts per layer a decode step of ``batch`` tokens reads, expected under uniform
    routing: each token picks top-k of E, so an expert is missed by all with (1 - k/E) ** B. One
    token reads k (gpt-oss-20b: 4 of 32); from a few dozen tokens on, nearly all."""
    return _touched(_text(raw), batch)


def _top_k(c: dict) -> int:
    """Experts per token: gpt-oss and Gemma 4 name it their own way."""
    return c.get("num_experts_per_tok") or c.get("experts_per_token") or c.get("top_k_experts") or 0


def _touched(c: dict, batch: int) -> float:
    experts, _ = _experts(c)
    top_k = _top_k(c)
    if not experts or not top_k:
        return float(experts)
    return experts * (1 - (1 - top_k / experts) ** batch)


def _experts(c: dict) -> tuple[int, int]:
    """(routed experts, their intermediate size); gpt-oss names them its own way."""
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    return experts, c.get("moe_intermediate_size") or c.get("intermediate_size", 0)


def sliding_kv(raw: dict, dtype_bytes: int = 2) -> tuple[int, int]:
    """(KV bytes per token of the sliding layers, their window)."""
    c = _text(raw)
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // heads
    n = sum(kind == "sliding_attention" for kind in c.get("layer_types") or ())
    return n * 2 * kv_heads * d * dtype_bytes, c.get("sliding_window") or 0


def decode_bytes(raw: dict, dtype_bytes: int = 2, state_bytes: int = 4,
                 batch: int | None = None) -> tuple[int, int, int]:
    """(weight bytes a decode step reads, KV bytes per token of context of the full-attention
    layers, recurrent-state bytes per request, read once): from a model's config.json.
    ``dtype_bytes=1`` counts parameters (MXFP4 experts included). ``batch``: the routed experts
    a step of that many tokens touches (``experts_touched``); None: all of them."""
    c = _text(raw)
    dense, experts, kv, state = _decode_parts(raw, c, dtype_bytes, state_bytes)
    return round(dense + experts * _touched_share(c, batch)), kv, state


def _touched_share(c: dict, batch: int | None) -> float:
    """The share of the routed experts' bytes a step of ``batch`` tokens reads (None: all)."""
    experts, _ = _experts(c)
    return 1.0 if not experts or batch is None else _touched(c, batch) / experts


def _decode_parts(raw: dict, c: dict, dtype_bytes: int,
                  state_bytes: int) -> tuple[int, float, int, int]:
    """``decode_bytes``' parts: (bytes of the weights but the routed experts, bytes of all routed
    experts, KV bytes per token of context, state bytes per request); ``c``: ``_text(raw)``."""
    h, vocab, layers = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or h // heads
    types = c.get("layer_types") or ["full_attention"] * layers
    gate = 2 if c.get("attn_output_gate") else 1
    experts, inter = _experts(c)
    mxfp4 = (raw.get("quantization_config") or {}).get("quant_method") == "mxfp4"
    expert_bytes = MXFP4_BYTES if mxfp4 and dtype_bytes > 1 else dtype_bytes
    weights, expert_weights, kv, state = vocab * h, 0, 0, 0  # the LM head
    for kind in types:
        if experts:  # the routed experts, the router, the shared expert
            expert_weights += 3 * h * inter * experts
            weights += h * experts + 3 * h * c.get("shared_expert_intermediate_size", 0)
        else:
            weights += 3 * h * c["intermediate_size"]
        if kind in ("full_attention", "sliding_attention"):
            weights += h * (gate * heads * d + 2 * kv_heads * d) + heads * d * h
            kv += 2 * kv_heads * d * dtype_bytes if kind == "full_attention" else 0
        else:
            hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            dk, dv, width = (c["linear_key_head_dim"], c["linear_value_head_dim"],
                             c["linear_conv_kernel_dim"])
            conv = 2 * hk * dk + hv * dv
            weights += h * (conv + hv * dv + 2 * hv) + hv * dv * h + conv * width
            state += hv * dk * dv * state_bytes + conv * (width - 1) * dtype_bytes
    return weights * dtype_bytes, expert_weights * expert_bytes, kv, state


def prefill_flops(raw: dict, prompt_lens: list[int]) -> float:
    c = _text(raw)
    weights, _, _ = decode_bytes(raw, dtype_bytes=1)
    experts, inter = _experts(c)
    if experts:  # a token runs its top-k experts only
        unused = experts - _top_k(c)
        weights -= c["num_hidden_layers"] * 3 * c["hidden_size"] * inter * unused
    params = weights - c["vocab_size"] * c["hidden_size"]  # the LM head: last tokens only
    heads = c["num_attention_heads"]
    d = c.get("head_dim") or c["hidden_size"] // heads
    types = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
    full = sum(kind == "full_attention" for kind in types)
    sliding = sum(kind == "sliding_attention" for kind in types)
    window = c.get("sliding_window") or 0
    return sum(2 * params * n + full * 2 * heads * d * n * n
               + sliding * 4 * heads * d * n * min(n, window) for n in prompt_lens)


def batch1_floor_ms(raw: dict, gpu: str, tp: int = 1) -> float | None:
    """Milliseconds a one-token decode step takes at least: its weights (the experts one token
    routes to) streamed at peak bandwidth, over ``tp`` GPUs; None for a GPU without figures."""
    if gpu not in BANDWIDTH:
        return None
    return 1000 * decode_bytes(raw, batch=1)[0] / (BANDWIDTH[gpu] * tp)


def ceiling_tok_per_s(raw: dict, prompt_lens: list[int], max_tokens: list[int], gpu: str,
                      state_bytes: int = 4) -> float | None:
    """Output tok/s of the workload at the ceiling, or None for a GPU without figures."""
    if gpu not in BANDWIDTH:
        return None
    c = _text(raw)
    dense, experts, kv, state = _decode_parts(raw, c, 2, state_bytes)
    window_kv, window = sliding_kv(raw)
    context, left = list(prompt_lens), list(max_tokens)
    alive = [i for i, n in enumerate(left) if n > 0]
    moved = 0.0
    while alive:
        b = len(alive)  # a MoE step reads the experts its b tokens route to
        moved += dense + experts * _touched_share(c, b) + kv * sum(context[i] for i in alive)
        moved += 2 * state * b
        moved += window_kv * sum(min(context[i], window) for i in alive)
        for i in alive:
            context[i] += 1
            left[i] -= 1
        alive = [i for i in alive if left[i] > 0]
    seconds = moved / BANDWIDTH[gpu] + prefill_flops(raw, prompt_lens) / MATMUL_FLOPS
    return sum(max_tokens) / seconds
