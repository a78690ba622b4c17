"""Tiny Gemma checkpoints that a server can chat with, whose greedy answer is scripted.

Each has ``gemma_models``' config (Gemma 4 without its MoE block) and a byte-level tokenizer (256
byte tokens, then ``<bos>``, ``<eos>``, ``<pad>`` and Gemma 4's markup ``<|tool_call>``,
``<tool_call|>``, ``<|"|>``, ``<|channel>``, ``<channel|>`` as special tokens). Its weights are
built so that its greedy answer to any chat is a fixed script (``_scripted``); tests force other
answers with a grammar:

- ``make_gemma4_tools_model``: a template in Gemma 4's shape that teaches its tool-call syntax (so
  the server picks the ``gemma4`` parser); the answer is a call of ``get_weather``.
- ``make_gemma4_thinking_model``: a template in Gemma 4's shape with ``enable_thinking``, which
  otherwise closes an empty thought channel in the prompt; thinking, the answer is a thought
  channel and then ``ANSWER``; not thinking, ``ANSWER`` alone.
- ``make_gemma3_tools_model``: a Gemma 3 with ``GEMMA3_TEMPLATE``, a template in Gemma 3's shape
  (no tools, the system message folded into the first user turn, an error unless user and model
  turns alternate); the answer is a call of ``get_weather`` in a ``tool_code`` block.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers.gemma_models import GEMMA4_TEXT
from helpers.gemma_models import TEXT as GEMMA3_TEXT

SPECIALS = ["<bos>", "<eos>", "<pad>", "<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>",
            "<channel|>"]
BOS, EOS, PAD = 256, 257, 258

GEMMA4_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools or messages[0].role == 'system' %}<|turn>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "{%- for tool in tools or [] %}<|tool>declaration:{{ tool.function.name }}"
    "{{ tool.function.parameters | tojson }}<tool|>{% endfor %}<turn|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}<|turn>user\n{{ m.content }}<turn|>\n"
    "{%- elif m.role == 'assistant' %}<|turn>model\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}<|tool_call>call:{{ c.function.name ~ '{' }}"
    "{%- for k, v in c.function.arguments.items() %}{{ k }}:"
    "{%- if v is string %}<|\"|>{{ v }}<|\"|>{% else %}{{ v | tojson }}{% endif %}"
    "{{ ',' if not loop.last }}{% endfor %}}<tool_call|>{% endfor %}<turn|>\n"
    "{%- elif m.role == 'tool' %}<|turn>user\n<|tool_response>response:{{ m.name }}"
    "{{ '{' }}value:<|\"|>{{ m.content }}<|\"|>}<tool_response|><turn|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|turn>model\n{% endif %}"
)

GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0].role == 'system' %}{% set prefix = messages[0].content + '\n\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}"
    "{% endif %}"
    "{%- for m in turns %}"
    "{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "<start_of_turn>{{ 'model' if m.role == 'assistant' else m.role }}\n"
    "{{ prefix if loop.first else '' }}{{ m.content | trim }}<end_of_turn>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def byte_tokenizer(template: str):
    """A byte-level BPE without merges: every byte one token, the specials after them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                  pad_token="<pad>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[3:]})
    assert tok.convert_tokens_to_ids(SPECIALS) == list(range(256, 256 + len(SPECIALS)))
    tok.chat_template = template
    return tok


GEMMA4_THINKING_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if enable_thinking or messages[0].role == 'system' %}<|turn>system\n"
    "{% if enable_thinking %}<|think|>{% endif %}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}<turn|>\n"
    "{% endif %}"
    "{%- for m in messages if m.role != 'system' %}"
    "<|turn>{{ 'model' if m.role == 'assistant' else m.role }}\n{{ m.content }}<turn|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|turn>model\n"
    "{% if not enable_thinking %}<|channel>thought\n<channel|>{% endif %}{% endif %}"
)

# the greedy answers after each model's generation prompt: each piece one token, each token with
# one successor
SCRIPT = ["<|tool_call>", "call:get_weather{city:", '<|"|>', 'Paris<|"|>}', "<tool_call|>"]
GEN_PROMPT = "<|turn>model\n"  # how every Gemma 4 prompt ends (one added token)
THOUGHT = "The user asks about Paris."
ANSWER = "Sunny in Paris."
# thinking off, the prompt ends with "<channel|>" itself, whose successor is the answer
THINKING_SCRIPT = ["<|channel>", f"thought\n{THOUGHT}", "<channel|>", ANSWER]
GEMMA3_GEN_PROMPT = "<start_of_turn>model\n"
CODE_SCRIPT = ["```tool_code\n", 'get_weather(city="Paris")', "\n```"]


def _scripted(model, tok, pieces: list[str], norm_offset: float) -> None:
    """Weights whose greedy output after ``pieces[0]`` is ``pieces[1:]`` then ``<eos>``.

    The pieces' embeddings are orthonormal (every other token lives in the dimensions left).
    Layer 0's MLP maps each piece to the next: one intermediate unit per piece, whose gate and up
    rows are that piece's embedding and whose down column is its successor's; its post-norm
    scales that up 4x over the embedding. Attention adds nothing (its post-norm scales by 0), nor
    do the later layers; the tied LM head then ranks the successor first. ``norm_offset``: what
    a norm's scale is over its weight (Gemma 3 scales by ``1 + w``, Gemma 4 by ``w``)."""
    ids = tok.convert_tokens_to_ids([*pieces, "<eos>"])
    sd = model.state_dict()
    h = sd["model.embed_tokens.weight"].shape[1]
    gen = torch.Generator().manual_seed(0)
    embed = torch.zeros_like(sd["model.embed_tokens.weight"])
    embed[:, len(ids):] = torch.randn(embed.shape[0], h - len(ids), generator=gen)
    embed /= embed.norm(dim=1, keepdim=True)
    for dim, t in enumerate(ids):
        embed[t] = 0
        embed[t, dim] = 1.0
    gate, up, down = (torch.zeros_like(sd[f"model.layers.0.mlp.{n}_proj.weight"])
                      for n in ("gate", "up", "down"))
    for unit, (cur, nxt) in enumerate(zip(ids, ids[1:])):
        gate[unit], up[unit] = embed[cur], embed[cur]
        down[:, unit] = embed[nxt]
    new = {"model.embed_tokens.weight": embed, "model.layers.0.mlp.gate_proj.weight": gate,
           "model.layers.0.mlp.up_proj.weight": up, "model.layers.0.mlp.down_proj.weight": down}
    for name, value in sd.items():
        if name.endswith("post_attention_layernorm.weight"):
            new[name] = torch.full_like(value, 0.0 - norm_offset)
        elif name.endswith("post_feedforward_layernorm.weight"):
            scale = 4.0 if ".layers.0." in name else 0.0
            new[name] = torch.full_like(value, scale - norm_offset)
        elif name.endswith("layernorm.weight") or name == "model.norm.weight":
            new[name] = torch.full_like(value, 1.0 - norm_offset)
    model.load_state_dict(new, strict=False)


def _save(out_dir: str | Path, arch: str, template: str, pieces: list[str]) -> Path:
    """The tiny ``arch`` (``gemma3`` or ``gemma4``) with the byte tokenizer, ``pieces`` that are
    not tokens yet added to its vocabulary, answering ``pieces[1:]`` after ``pieces[0]``."""
    import transformers as tf

    out = Path(out_dir)
    tok = byte_tokenizer(template)
    tok.add_tokens([p for p in pieces if p not in SPECIALS])
    ids = dict(vocab_size=len(tok), bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    torch.manual_seed(0)
    if arch == "gemma3":
        # the described tools take a system message of a few hundred byte tokens
        cfg = dict(GEMMA3_TEXT, **ids, max_position_embeddings=4096)
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**cfg))
    else:
        cfg = dict(GEMMA4_TEXT, **ids, enable_moe_block=False, num_experts=None,
                   top_k_experts=None, moe_intermediate_size=None)
        model = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**cfg))
    model = model.to(torch.float32).eval()
    with torch.no_grad():
        _scripted(model, tok, pieces, 1.0 if arch == "gemma3" else 0.0)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS}) + "\n")
    return out


def make_gemma4_tools_model(out_dir: str | Path) -> Path:
    """The tiny Gemma 4 whose greedy answer to every chat is a call of ``get_weather``."""
    return _save(out_dir, "gemma4", GEMMA4_TEMPLATE, [GEN_PROMPT, *SCRIPT])


def make_gemma4_thinking_model(out_dir: str | Path) -> Path:
    """The tiny Gemma 4 that thinks ``THOUGHT`` and answers ``ANSWER`` with ``enable_thinking``,
    and answers ``ANSWER`` alone without."""
    return _save(out_dir, "gemma4", GEMMA4_THINKING_TEMPLATE, [GEN_PROMPT, *THINKING_SCRIPT])


def make_gemma3_tools_model(out_dir: str | Path) -> Path:
    """The tiny Gemma 3 whose greedy answer to every chat is a ``tool_code`` block calling
    ``get_weather``."""
    return _save(out_dir, "gemma3", GEMMA3_TEMPLATE, [GEMMA3_GEN_PROMPT, *CODE_SCRIPT])
