"""A tiny Gemma 4 checkpoint that a server can chat with: ``gemma_models``' config (no MoE block)
with a byte-level tokenizer (256 byte tokens, then ``<bos>``, ``<eos>``, ``<pad>`` and Gemma 4's
tool markup ``<|tool_call>``, ``<tool_call|>``, ``<|"|>`` as special tokens), and a chat template
in Gemma 4's shape that teaches its tool-call syntax (so the server picks the ``gemma4`` parser).
Its weights are built so that its greedy answer to any chat is a call of ``get_weather``
(``_scripted``); tests force other answers with a grammar.

``GEMMA3_TEMPLATE`` is a template in Gemma 3's shape: no tools, the system message folded into the
first user turn, and an error unless user and model turns alternate.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers.gemma_models import GEMMA4_TEXT

SPECIALS = ["<bos>", "<eos>", "<pad>", "<|tool_call>", "<tool_call|>", '<|"|>']
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


# the greedy answer to any chat: each piece one token, each token with one successor
SCRIPT = ["<|tool_call>", "call:get_weather{city:", '<|"|>', 'Paris<|"|>}', "<tool_call|>"]
GEN_PROMPT = "<|turn>model\n"  # how every prompt ends (one added token)


def _scripted(model, tok) -> None:
    """Weights whose greedy output after ``GEN_PROMPT`` is ``SCRIPT`` then ``<eos>``.

    The script tokens' embeddings are orthonormal (every other token lives in the dimensions
    left). Layer 0's MLP maps each script token to the next: one intermediate unit per token,
    whose gate and up rows are that token's embedding and whose down column is its successor's;
    its post-norm scales that up 4x over the embedding. Attention adds nothing (its post-norm
    weight is 0, Gemma 4's norms scaling by ``w``), nor do the later layers; the tied LM head
    then ranks the successor first."""
    ids = tok.convert_tokens_to_ids([GEN_PROMPT, *SCRIPT, "<eos>"])
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
            new[name] = torch.zeros_like(value)
        elif name.endswith("post_feedforward_layernorm.weight"):
            new[name] = torch.full_like(value, 4.0 if ".layers.0." in name else 0.0)
        elif name.endswith("layernorm.weight") or name == "model.norm.weight":
            new[name] = torch.ones_like(value)
    model.load_state_dict(new, strict=False)


def make_gemma4_tools_model(out_dir: str | Path) -> Path:
    """The tiny Gemma 4 (no MoE block) with the byte tokenizer, ``SCRIPT``'s pieces added to its
    vocabulary, whose greedy answer to every chat is a call of ``get_weather``."""
    import transformers as tf

    out = Path(out_dir)
    tok = byte_tokenizer(GEMMA4_TEMPLATE)
    tok.add_tokens([GEN_PROMPT, SCRIPT[1], SCRIPT[3]])
    cfg = dict(GEMMA4_TEXT, vocab_size=len(tok), bos_token_id=BOS, eos_token_id=EOS,
               pad_token_id=PAD, enable_moe_block=False, num_experts=None, top_k_experts=None,
               moe_intermediate_size=None)
    torch.manual_seed(0)
    model = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**cfg)).to(torch.float32).eval()
    with torch.no_grad():
        _scripted(model, tok)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS}) + "\n")
    return out
