"""A tiny Gemma 4 checkpoint that a server can chat with: random weights (``gemma_models``' config)
with a byte-level tokenizer (256 byte tokens, then ``<bos>``, ``<eos>``, ``<pad>`` and Gemma 4's
tool markup ``<|tool_call>``, ``<tool_call|>``, ``<|"|>`` as special tokens), and a chat template
in Gemma 4's shape that teaches its tool-call syntax (so the server picks the ``gemma4`` parser).
Tests force its output with a grammar.

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
    "{%- elif m.role == 'tool' %}<|turn>user\n<|tool_response>response:"
    "{{ m.content }}<tool_response|><turn|>\n{% endif %}"
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


def make_gemma4_tools_model(out_dir: str | Path) -> Path:
    import transformers as tf

    out = Path(out_dir)
    cfg = dict(GEMMA4_TEXT, vocab_size=256 + len(SPECIALS), bos_token_id=BOS, eos_token_id=EOS,
               pad_token_id=PAD)
    torch.manual_seed(0)
    model = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**cfg)).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    byte_tokenizer(GEMMA4_TEMPLATE).save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS}) + "\n")
    return out
