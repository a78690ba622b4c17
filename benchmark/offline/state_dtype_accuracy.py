"""What a bf16 recurrent state costs in accuracy: a hybrid model's logits with its delta-rule
state kept in bf16 against fp32 (``--mamba-ssm-dtype``).

    python benchmark/offline/state_dtype_accuracy.py --model benchmark/configs/qwen3.5-0.8b.json \
        [--prompts 4] [--new-tokens 64] [--device cpu] --out DIR

Both runs decode the same prompts greedily (random weights of ``--model``, seed 0, when it is a
config.json); every decode step stores the state and the next one reads it back, which is where
the dtype rounds. At each step until the two greedy continuations part, the logits are compared:
mean and max absolute difference, relative to the mean |logit|; ``agreement`` is the fraction of
positions whose greedy tokens agree (a continuation that parted counts as disagreeing from there).
Writes ``state_dtype_accuracy_<model>_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))

from bench_common import model_dir, project_commit  # noqa: E402

from helpers.engine_utils import record_sampled_logits  # noqa: E402
from minisgl import LLM, SamplingParams  # noqa: E402


def run(path: str, dummy: bool, device: str, state: str, prompts, new_tokens: int):
    """(greedy continuations, per request the logits of each decode step [T, vocab], on CPU)."""
    llm = LLM(path, dummy_weights=dummy, device=device, mamba_ssm_dtype=state, warmup="off",
              cuda_graph_max_bs=0, max_running_requests=len(prompts), kv_cache_memory_gb=4)
    recorded = record_sampled_logits(llm.scheduler.engine)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    llm.close()
    uids = sorted(recorded)
    return [o.token_ids for o in outs], [torch.stack(recorded[u]).float().cpu() for u in uids]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args()
    path, dummy = model_dir(args.model)
    rng = random.Random(0)
    prompts = [[rng.randint(10, 10000) for _ in range(args.prompt_len)]
               for _ in range(args.prompts)]
    ref_tokens, ref_logits = run(path, dummy, args.device, "float32", prompts, args.new_tokens)
    tokens, logits = run(path, dummy, args.device, "bfloat16", prompts, args.new_tokens)
    mean_diff, max_diff, scale, agree, total = 0.0, 0.0, 0.0, 0, 0
    for ref_t, t, ref_l, lg in zip(ref_tokens, tokens, ref_logits, logits):
        same = next((i for i, (a, b) in enumerate(zip(ref_t, t)) if a != b), len(ref_t))
        n = min(same + 1, len(ref_l), len(lg))  # the step that parts still read the same inputs
        diff = (ref_l[:n] - lg[:n]).abs()
        mean_diff += float(diff.mean()) / len(prompts)
        max_diff = max(max_diff, float(diff.max()))
        scale += float(ref_l[:n].abs().mean()) / len(prompts)
        agree += same
        total += len(ref_t)
    name = os.path.basename(args.model).removesuffix(".json")
    result = {"model": name, "device": args.device, "commit": project_commit(),
              "prompts": args.prompts, "prompt_len": args.prompt_len,
              "new_tokens": args.new_tokens, "mean_abs_logit": round(scale, 4),
              "mean_abs_diff": round(mean_diff, 5), "max_abs_diff": round(max_diff, 5),
              "relative_mean_diff": round(mean_diff / scale, 6) if scale else None,
              "agreement": round(agree / total, 4), "command": " ".join(["python", *sys.argv])}
    print(json.dumps(result, indent=1))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"state_dtype_accuracy_{name}_{args.device}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
