"""A tiny gpt-oss whose greedy output is a harmony exchange, for the round trip through a real
server: turn 1 calls ``get_weather`` (``commentary to=functions.get_weather``), turn 2, after the
tool's result, reasons (``analysis``) and answers (``final``).

Its weights are built, not trained. Script tokens have orthonormal embeddings (every other token
lives in the dimensions left), the MoE's down projection is zero, and the LM head maps each script
token to the one after it. Where one token has several successors (``<|channel|>`` is followed
by ``commentary``, then ``analysis``, then ``final``; ``<|message|>`` by the arguments, the
reasoning, the answer), three attention heads decide: each looks, with a constant query, for one
marker in the context (``<|call|>``: a tool was called before; ``analysis``; ``final``), and adds
a flag to the residual stream when it is there; the LM head weighs the flags so that the right
candidate wins (its other logits stay far below the next token's). The query and key use the
slowest RoPE dimension of a huge base, so position does not matter.

The tokenizer is o200k_harmony's, converted by transformers from the ``o200k_base`` file that
``minisgl.tokenizer.harmony`` supplies.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, HEADS, HEAD_DIM, VOCAB = 128, 4, 16, 201088
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ARGS, REASONING, ANSWER = '{"city":"Paris"}', "The tool says sun.", "Sunny in Paris!"
# o200k's pre-tokenizer pattern (tiktoken's o200k_base)
_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+",
])


def scripts(encoding) -> tuple[list[int], list[int]]:
    """The two outputs' token ids (after the prompt's ``<|start|>assistant``)."""
    def enc(text: str) -> list[int]:
        return encoding.encode(text, allowed_special="all")

    turn1 = enc("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                f"{ARGS}<|call|>")
    turn2 = enc(f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant"
                f"<|channel|>final<|message|>{ANSWER}<|return|>")
    return turn1, turn2


def _weights(encoding) -> dict[str, torch.Tensor]:
    turn1, turn2 = scripts(encoding)
    assistant = encoding.encode("<|start|>assistant", allowed_special="all")[-1]
    channel, message = (encoding.encode(t, allowed_special="all")[0]
                        for t in ("<|channel|>", "<|message|>"))
    call = encoding.encode("<|call|>", allowed_special="all")[0]
    analysis, final = turn2[1], turn2[turn2.index(channel, 1) + 1]
    markers = (call, analysis, final)  # flags F1, F2, F3
    nxt: dict[int, int] = {}
    for seq in ([assistant] + turn1, [assistant] + turn2):
        for cur, after in zip(seq, seq[1:]):
            if cur not in (channel, message):
                assert nxt.setdefault(cur, after) == after, f"token {cur} has two successors"
    tokens = sorted(set(turn1) | set(turn2) | {assistant})
    dim = {t: i for i, t in enumerate(tokens)}
    flag = [len(tokens) + h for h in range(3)]
    rest = len(tokens) + 3
    gen = torch.Generator().manual_seed(0)
    embed = torch.zeros(VOCAB, HIDDEN)
    embed[:, rest:] = torch.randn(VOCAB, HIDDEN - rest, generator=gen)
    embed /= embed.norm(dim=1, keepdim=True).clamp_min(1e-6)
    for t, i in dim.items():
        embed[t] = 0
        embed[t, i] = 1.0
    alpha, beta = 10.0, 2.0
    lm = torch.zeros(VOCAB, HIDDEN)
    for cur, after in nxt.items():
        lm[after, dim[cur]] += alpha
    # (cur, [candidates], their flag weights over F1, F2, F3, and a constant for the first)
    choices = [(channel, [turn1[1], analysis, final], [(0, 0, 0), (1, 0, 0), (0.6, 1, 0)]),
               (message, [turn1[turn1.index(message) + 1], turn2[3],
                          turn2[turn2.index(message, 3) + 1]], [(0, 0, 0), (0, 1, 0), (0, 0.6, 1)])]
    for cur, candidates, weights in choices:
        for k, (cand, w) in enumerate(zip(candidates, weights)):
            lm[cand, dim[cur]] += alpha + (0.5 * beta if k == 0 else 0.0)
            for h in range(3):
                lm[cand, flag[h]] += beta * w[h]
    q, s = torch.zeros(HEADS * HEAD_DIM), HIDDEN**0.5  # the norm scales a unit embedding to s
    k_w, v_w = torch.zeros(HEADS * HEAD_DIM, HIDDEN), torch.zeros(HEADS * HEAD_DIM, HIDDEN)
    o_w = torch.zeros(HIDDEN, HEADS * HEAD_DIM)
    for h, marker in enumerate(markers):
        slow = h * HEAD_DIM + HEAD_DIM // 2 - 1  # the pair that barely rotates
        q[slow] = 8.0
        k_w[slow, dim[marker]] = 20.0 / s  # score 8 * 20 / sqrt(16) = 40 on the marker, else 0
        v_w[h * HEAD_DIM, dim[marker]] = 1.0 / s
        o_w[flag[h], h * HEAD_DIM] = 1.0
    p, e, inter = "model.layers.0.", 4, 64
    w = {"model.embed_tokens.weight": embed, "lm_head.weight": lm,
         "model.norm.weight": torch.ones(HIDDEN)}
    w.update({p + "input_layernorm.weight": torch.ones(HIDDEN),
              p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
              p + "self_attn.q_proj.weight": torch.zeros(HEADS * HEAD_DIM, HIDDEN),
              p + "self_attn.q_proj.bias": q,
              p + "self_attn.k_proj.weight": k_w, p + "self_attn.k_proj.bias": torch.zeros(64),
              p + "self_attn.v_proj.weight": v_w, p + "self_attn.v_proj.bias": torch.zeros(64),
              p + "self_attn.o_proj.weight": o_w, p + "self_attn.o_proj.bias": torch.zeros(HIDDEN),
              p + "self_attn.sinks": torch.zeros(HEADS),
              p + "mlp.router.weight": torch.zeros(e, HIDDEN),
              p + "mlp.router.bias": torch.zeros(e),
              p + "mlp.experts.gate_up_proj": torch.zeros(e, HIDDEN, 2 * inter),
              p + "mlp.experts.gate_up_proj_bias": torch.zeros(e, 2 * inter),
              p + "mlp.experts.down_proj": torch.zeros(e, inter, HIDDEN),
              p + "mlp.experts.down_proj_bias": torch.zeros(e, HIDDEN)})
    return {k: v.to(torch.bfloat16).contiguous() for k, v in w.items()}


def make_harmony_model(out_dir: str | Path) -> Path:
    """Config, weights and tokenizer of the scripted gpt-oss in ``out_dir``."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from minisgl.tokenizer.harmony import VOCAB_ENV, Harmony

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    harmony = Harmony()  # supplies o200k_base
    encoding = harmony.encoding
    save_file(_weights(encoding), out / "model.safetensors", metadata={"format": "pt"})
    config = {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "head_dim": HEAD_DIM,
        "num_local_experts": 4, "num_experts_per_tok": 2, "layer_types": ["full_attention"],
        "sliding_window": 128, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e9}, "rope_theta": 1e9,
        "attention_bias": True, "tie_word_embeddings": False, "dtype": "bfloat16",
        "eos_token_id": 200002, "pad_token_id": 199999,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [200002, 199999, 200012], "do_sample": False}))
    base = Path(os.environ[VOCAB_ENV]) / "o200k_base.tiktoken"
    specials = [encoding.decode([i]) for i in range(199998, VOCAB)]
    tok = TikTokenConverter(vocab_file=str(base), pattern=_PATTERN,
                            extra_special_tokens=specials).converted()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|return|>",
                                   pad_token="<|endoftext|>")
    # never rendered (harmony renders gpt-oss chats); it names the effort like gpt-oss's does, so
    # the agent APIs pass theirs on
    fast.chat_template = "{# harmony: reasoning_effort #}{{ messages[-1]['content'] }}"
    fast.save_pretrained(out)
    return out
