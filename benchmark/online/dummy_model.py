"""A model directory for serving benchmarks without a checkpoint: a config and a synthetic
tokenizer.

    python benchmark/online/dummy_model.py benchmark/configs/qwen3-8b.json /tmp/qwen3-8b
    python -m minisgl --model /tmp/qwen3-8b --dummy-weights

Every tokenizer is byte-level BPE without merges: ids 0-255 are the bytes, so any text encodes
(a JSON schema's or a tool call's grammar can be followed: a tokenizer of words alone allows no
token of ``{"n": 1}``, and a constrained request would end at its first token), and every other id
is the word ``t<i>``, so every id the random-weight model samples above the bytes detokenizes to
text of its own: `` t<i>`` (a streamed chunk a token), ``t<i>`` for Qwen3.5/3.6 (below). Prompts
are sent as token ids (``bench_serving.py --prompt-kind ids``), so lengths stay exact.

A Qwen3.5/3.6 config gets a tokenizer transformers' ``Qwen3_5Tokenizer`` can run (transformers
imposes that class on their ``model_type``, whatever ``tokenizer_config.json`` names, and it splits
text into bytes before its BPE): the chat tokens and vision tokens special at their ids in the
released vocabulary, a ChatML template that places
``<|vision_start|><|image_pad|><|vision_end|>`` for an image part, and the released checkpoints'
``preprocessor_config.json``: ``LLM.chat`` and the chat APIs take text and images
(``benchmark/offline/bench_images.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

# ChatML's shape, the Qwen models' format, in plain words (chat requests work too)
CHAT_TEMPLATE = ("{% for m in messages %}t1 {{ m['role'] }} {{ m['content'] }} t2 {% endfor %}"
                 "{% if add_generation_prompt %}t1 assistant {% endif %}")
# Qwen3.5/3.6: ChatML over bytes, with Qwen's vision placeholder for an image part
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}"
    "{{ m['content'] }}{% else %}{% for p in m['content'] %}{% if p['type'] == 'text' %}"
    "{{ p['text'] }}{% else %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}")
QWEN_ARCHS = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
# the released vocabulary's ids (the vision ones are the config's)
QWEN_CHAT_TOKENS = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046}
QWEN_VISION_TOKENS = {"vision_start_token_id": "<|vision_start|>",
                      "vision_end_token_id": "<|vision_end|>", "image_token_id": "<|image_pad|>",
                      "video_token_id": "<|video_pad|>"}


def write_dummy_model(config_json: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(config_json, os.path.join(out_dir, "config.json"))
    with open(config_json) as f:
        raw = json.load(f)
    # a vision-language checkpoint (Qwen3.5, Gemma 3) keeps its text model's under text_config
    vocab_size = raw.get("vocab_size") or raw["text_config"]["vocab_size"]
    if raw.get("architectures", [""])[0] in QWEN_ARCHS:
        vision = {name: raw[key] for key, name in QWEN_VISION_TOKENS.items()
                  if isinstance(raw.get(key), int)}
        specials = {**QWEN_CHAT_TOKENS, **vision}
        tok = byte_tokenizer(vocab_size, specials, word_prefix="")
        config = {"unk_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                  "chat_template": QWEN_TEMPLATE}
        if "vision_config" in raw:
            write_preprocessor_config(raw["vision_config"], out_dir)
    else:
        tok = byte_tokenizer(vocab_size, {}, word_prefix=_SPACE)
        config = {"unk_token": None, "chat_template": CHAT_TEMPLATE}
        eos = raw.get("eos_token_id")  # named by the tokenizer too, as released tokenizers do
        if eos is not None:
            config["eos_token"] = tok.id_to_token(eos[0] if isinstance(eos, list) else eos)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
                   **config}, f)
    return out_dir


# GPT-2's byte-level character for a space: a word ``Ġt7`` decodes to " t7"
_SPACE = "\u0120"


def byte_tokenizer(vocab_size: int, specials: dict[str, int], word_prefix: str) -> Tokenizer:
    """Byte-level BPE without merges: one token a byte (ids 0-255), ``word_prefix + t<i>`` above,
    ``specials`` (name -> id) at their ids."""
    if vocab_size <= 256:
        raise ValueError(f"vocab_size {vocab_size}: the dummy tokenizer needs more than 256 ids")
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    others = iter(range(256, 512))  # GPT-2's characters of the other bytes, in byte order
    vocab = {chr(b) if b in printable else chr(next(others)): b for b in range(256)}
    specials = {name: i for name, i in specials.items() if 256 <= i < vocab_size}
    taken = set(specials.values())
    vocab.update({f"{word_prefix}t{i}": i for i in range(256, vocab_size) if i not in taken})
    vocab.update(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    if specials:
        tok.add_special_tokens(list(specials))  # matched before the byte split, at their ids
    return tok


def write_preprocessor_config(vision: dict, out_dir: str) -> None:
    """Qwen3.5/3.6's released ``preprocessor_config.json``: 64 Ki to 16 Mi pixels an image, the
    tower's patch and merge sizes."""
    config = {"image_processor_type": "Qwen2VLImageProcessor",
              "processor_class": "Qwen3VLProcessor",
              "patch_size": vision.get("patch_size", 16),
              "temporal_patch_size": vision.get("temporal_patch_size", 2),
              "merge_size": vision.get("spatial_merge_size", 2),
              "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
              "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a config.json, e.g. benchmark/configs/qwen3-0.6b.json")
    parser.add_argument("out_dir")
    args = parser.parse_args()
    print(write_dummy_model(args.config, args.out_dir))


if __name__ == "__main__":
    main()
