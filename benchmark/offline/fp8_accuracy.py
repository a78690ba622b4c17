"""What FP8 costs in accuracy: the logits of an FP8 model against its bf16 original.

    python benchmark/offline/fp8_accuracy.py --model benchmark/configs/qwen3-8b.json \
        [--variant fp8|fp8-block|fp8-kv|fp8+fp8-kv] [--prompts 8] [--new-tokens 256] --out DIR

The bf16 model (random weights of ``--model``, seed 0, when it is a config.json) greedily continues
each prompt by ``--new-tokens`` tokens. Both models then read the same prompt + continuation in one
prefill (teacher forcing, so that one early divergence does not decide every later position), and at
each of the generated positions we compare: the mean absolute difference of the logits (with the
mean |logit| for scale) and whether the two greedy tokens agree. ``free_running_agreement`` is the
fraction of the FP8 model's own greedy tokens that equal the bf16 model's, position by position.
Writes ``fp8_accuracy_<model>_<variant>_<gpu>_<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import random
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))

from bench import VARIANTS, gpu_name, model_dir  # noqa: E402

from helpers.engine_utils import prefill_logits  # noqa: E402
from minisgl import LLM, SamplingParams  # noqa: E402


def run(path: str, dummy: bool, options: dict, prompts, new_tokens: int, continued=None):
    """(greedy continuations, logits at the generated positions [P, T, vocab] on the CPU; T is
    ``new_tokens``, or fewer if a continuation came back shorter).

    ``cache="naive"``: with the default radix cache, the teacher-forced prefill below found the
    prompts (and, for the bf16 run, the whole continuations) that ``generate`` had just cached, and
    computed only the uncached tail of each sequence; its logits then had fewer rows than the
    tokens, the slices below ran past the end, and some request got ``[0, vocab]`` (the
    ``torch.stack`` error). Each sequence is also prefilled on its own, so no prefill budget or
    batch shape can cut it either, and the row count is checked."""
    llm = LLM(path, dummy_weights=dummy, cache="naive", **options)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    outs = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    conts = continued or outs
    steps = min(len(c) for c in conts)
    if steps < new_tokens:
        print(f"note: a continuation has {steps} of {new_tokens} tokens; comparing {steps}",
              flush=True)
    rows = []
    for p, c in zip(prompts, conts):
        full = p + c[:steps]
        logits = prefill_logits(llm.scheduler, [full])
        if logits.shape[0] != len(full):
            raise RuntimeError(
                f"prefill returned {logits.shape[0]} logits rows for {len(full)} tokens")
        # the logits at position i predict token i + 1: those of the generated tokens
        rows.append(logits[len(p) - 1 : len(full) - 1].float().cpu())
        del logits
    llm.close()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return outs, torch.stack(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--variant", default="fp8",
                        choices=["fp8", "fp8-block", "fp8-kv", "fp8+fp8-kv"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    args = parser.parse_args()
    path, dummy = model_dir(args.model)
    rng = random.Random(0)
    prompts = [[rng.randint(0, 10000) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    base_tokens, base = run(path, dummy, {"dtype": "bfloat16"}, prompts, args.new_tokens)
    options = {"dtype": "bfloat16", **VARIANTS[args.variant]}
    fp8_tokens, fp8 = run(path, dummy, options, prompts, args.new_tokens, continued=base_tokens)
    steps = min(fp8.shape[1], base.shape[1])
    fp8, base = fp8[:, :steps], base[:, :steps]
    agree = (fp8.argmax(-1) == base.argmax(-1)).float().mean().item()
    free = sum(a == b for x, y in zip(fp8_tokens, base_tokens) for a, b in zip(x, y))
    compared = sum(min(len(x), len(y)) for x, y in zip(fp8_tokens, base_tokens))
    name = os.path.basename(args.model).removesuffix(".json")
    commit = os.environ.get("MINISGL_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"model": name, "variant": args.variant, "gpu": gpu_name(), "commit": commit,
              "date": datetime.date.today().isoformat(), "prompts": args.prompts,
              "new_tokens": args.new_tokens, "teacher_forced_positions": steps,
              "quantization": VARIANTS[args.variant].get("quantization"),
              "logit_mean_abs_diff": round((fp8 - base).abs().mean().item(), 5),
              "logit_mean_abs": round(base.abs().mean().item(), 5),
              "greedy_agreement_teacher_forced": round(agree, 4),
              "free_running_agreement": round(free / max(compared, 1), 4)}
    print(json.dumps(result), flush=True)
    os.makedirs(args.out, exist_ok=True)
    stem = f"fp8_accuracy_{name}_{args.variant}_{result['gpu']}_{result['date']}"
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
