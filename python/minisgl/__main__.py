"""``python -m minisgl``: answer a few chat prompts with the offline engine (the default model when
no ``--model`` is given)."""

from __future__ import annotations

import argparse
import os
import sys

DEMO_CHATS = [
    "What is the capital of France?",
    "Give me three tips for writing clear code.",
    "Explain what a KV cache is in one sentence.",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minisgl", description=__doc__)
    parser.add_argument("--model", default=None, help="HF directory, repo id or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("prompts", nargs="*", help="chat prompts (default: a few examples)")
    args = parser.parse_args(argv)

    from minisgl import LLM, SamplingParams

    try:
        llm = LLM(args.model, device=args.device, dtype=args.dtype)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    prompts = args.prompts or DEMO_CHATS
    chats = [[{"role": "user", "content": p}] for p in prompts]
    outputs = llm.chat(chats, SamplingParams(temperature=0, max_tokens=args.max_tokens))
    for prompt, out in zip(prompts, outputs):
        print(f"\n>>> {prompt}\n{out.text}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
