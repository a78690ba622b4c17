"""A model directory for serving benchmarks without a checkpoint: a config and a synthetic
tokenizer.

    python benchmark/online/dummy_model.py benchmark/configs/qwen3-8b.json /tmp/qwen3-8b
    python -m minisgl --model /tmp/qwen3-8b --dummy-weights

The tokenizer is word-level over the config's whole vocabulary (token ``i`` is the word ``t<i>``),
so every id the random-weight model samples detokenizes to text and every streamed token is a
chunk (Qwen3.5/3.6: below).
Prompts are sent as token ids (``bench_serving.py --prompt-kind ids``), so lengths stay exact.

A Qwen3.5/3.6 config gets a tokenizer transformers' ``Qwen3_5Tokenizer`` can run (transformers
imposes that class on their ``model_type``, whatever ``tokenizer_config.json`` names, and it splits
text into bytes before its BPE, so a word-level vocabulary encodes no text at all): ids 0-255 are
the bytes, every other id the word ``t<i>``, the chat tokens and vision tokens special at their
ids in the released vocabulary, a ChatML template that places
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

# ChatML, the Qwen models' format, over the word-level vocabulary (chat requests work too)
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
        tok, config = qwen_tokenizer(raw, vocab_size), {
            "unk_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "chat_template": QWEN_TEMPLATE}
        if "vision_config" in raw:
            write_preprocessor_config(raw["vision_config"], out_dir)
    else:
        vocab = {f"t{i}": i for i in range(vocab_size)}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
        config = {"unk_token": "t0", "chat_template": CHAT_TEMPLATE}
        eos = raw.get("eos_token_id")  # named by the tokenizer too, as released tokenizers do
        if eos is not None:
            config["eos_token"] = f"t{eos[0] if isinstance(eos, list) else eos}"
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
                   **config}, f)
    return out_dir


def qwen_tokenizer(raw: dict, vocab_size: int) -> Tokenizer:
    """Byte-level BPE without merges: one token a byte, ``t<i>`` above 255, the specials."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    others = iter(range(256, 512))  # GPT-2's characters of the other bytes, in byte order
    vocab = {chr(b) if b in printable else chr(next(others)): b for b in range(256)}
    specials = {**QWEN_CHAT_TOKENS, **{name: raw[key] for key, name in QWEN_VISION_TOKENS.items()
                                       if isinstance(raw.get(key), int)}}
    specials = {name: i for name, i in specials.items() if 256 <= i < vocab_size}
    taken = set(specials.values())
    vocab.update({f"t{i}": i for i in range(256, vocab_size) if i not in taken})
    vocab.update(specials)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
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
