"""Where a decode step's time goes: torch.profiler over batch-1 decode, kernels ranked by GPU time.

    python benchmark/offline/profile_decode.py --model benchmark/configs/qwen3-8b.json --out DIR
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))

from bench import VARIANTS, model_dir  # noqa: E402
from minisgl import LLM, SamplingParams  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128, help="tokens of every prompt")
    parser.add_argument("--out", default=".")
    parser.add_argument("--quantization", default=None, help="e.g. fp8")
    parser.add_argument("--variant", default="default",
                        help="a bench.py variant whose sampling settings the requests carry")
    args = parser.parse_args()
    path, dummy = model_dir(args.model)
    llm = LLM(path, dummy_weights=dummy, num_pages=65536, quantization=args.quantization)
    prompts = [[(7 * i + j) % 10000 for j in range(args.prompt_len)] for i in range(args.batch)]
    sampling = VARIANTS[args.variant].get("sampling", {"temperature": 0})
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, **sampling)
    llm.generate(prompts, params, use_tqdm=False)
    tic = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    print(f"{args.variant}: {(time.perf_counter() - tic) / args.tokens * 1e3:.2f} ms per step "
          f"(batch {args.batch}, unprofiled)", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    table += "\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    tag = "".join(f"_{t}" for t in (args.quantization, args.variant) if t and t != "default")
    tag += f"_prompt{args.prompt_len}" if args.prompt_len != 128 else ""
    with open(os.path.join(args.out, f"profile_decode_bs{args.batch}{tag}.txt"), "w") as f:
        f.write(table)


if __name__ == "__main__":
    main()
