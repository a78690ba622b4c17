"""A model directory for serving benchmarks without a checkpoint: a config and a synthetic
tokenizer.

    python benchmark/online/dummy_model.py benchmark/configs/qwen3-8b.json /tmp/qwen3-8b
    python -m minisgl --model /tmp/qwen3-8b --dummy-weights

The tokenizer is word-level over the config's whole vocabulary (token ``i`` is the word ``t<i>``),
so every id the random-weight model samples detokenizes to text and every streamed token is a
chunk.
Prompts are sent as token ids (``bench_serving.py --prompt-kind ids``), so lengths stay exact.
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


def write_dummy_model(config_json: str, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(config_json, os.path.join(out_dir, "config.json"))
    with open(config_json) as f:
        raw = json.load(f)
    # a vision-language checkpoint (Qwen3.5, Gemma 3) keeps its text model's under text_config
    vocab_size = raw.get("vocab_size") or raw["text_config"]["vocab_size"]
    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0",
                   "model_max_length": 1 << 20, "chat_template": CHAT_TEMPLATE}, f)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a config.json, e.g. benchmark/configs/qwen3-0.6b.json")
    parser.add_argument("out_dir")
    args = parser.parse_args()
    print(write_dummy_model(args.config, args.out_dir))


if __name__ == "__main__":
    main()
