"""Batch-1 decode latency with programmatic dependent launch (PDL) off and on, and the GEMVs' L2
prefetch budget swept, for bf16 and FP8 weights of one model, in one process.

    python benchmark/offline/bench_pdl.py --model benchmark/configs/qwen3-8b.json \
        --prefetch 0,16384,32768 --out benchmark/results

Each configuration builds its own ``LLM`` (the CUDA graphs keep the launch attributes they were
captured with; one decode graph of batch 1, no piecewise graphs) and decodes 256 tokens of one
128-token prompt, greedy: ms per token = (total - time to first token) / 255, the median of
``--repeats``. The tokens of every configuration must equal those of PDL off (the same kernels and
the same arithmetic; only the launch order's overlap differs): a mismatch is printed and fails.
Writes ``<date>_pdl_<model>_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))

from bench_common import environment, gpu_name, model_dir, project_commit  # noqa: E402
from minisgl import LLM, SamplingParams  # noqa: E402
from minisgl.kernel.triton import pdl  # noqa: E402


def decode(path: str, dummy: bool, options: dict, repeats: int, new_tokens: int = 256):
    llm = LLM(path, dummy_weights=dummy, cuda_graph_max_bs=1, piecewise_cuda_graph_max_tokens=0,
              **options)
    prompt = [random.Random(1).randint(0, 10000) for _ in range(128)]
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    full = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    tokens = llm.generate([prompt], full, use_tqdm=False)[0].token_ids  # warm-up
    per_token = []
    for _ in range(repeats):
        times = []
        for params in (first, full):
            torch.cuda.synchronize()
            start = time.perf_counter()
            llm.generate([prompt], params, use_tqdm=False)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        per_token.append(1000 * (times[1] - times[0]) / (new_tokens - 1))
    llm.close()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return statistics.median(per_token), list(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="HF directory, or a config.json (dummy weights)")
    parser.add_argument("--weights", default="bf16,fp8", help="comma list of bf16, fp8")
    parser.add_argument("--prefetch", default="0,16384",
                        help="comma list of the GEMV prefetch budgets (bytes per program) with PDL")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmark/results")
    args = parser.parse_args()
    path, dummy = model_dir(args.model)
    name = os.path.basename(args.model.rstrip("/")).removesuffix(".json").lower()
    rows, failed = [], False
    for weights in args.weights.split(","):
        options = {"quantization": "fp8"} if weights == "fp8" else {}
        base_ms, base_tokens = None, None
        for pf in [None] + [int(p) for p in args.prefetch.split(",")]:
            saved = pdl.GEMV_PREFETCH_BYTES
            pdl.GEMV_PREFETCH_BYTES = pf or 0
            try:
                with environment({"MINISGL_PDL": "0" if pf is None else "1"}):
                    ms, tokens = decode(path, dummy, options, args.repeats)
            finally:
                pdl.GEMV_PREFETCH_BYTES = saved
            if pf is None:
                base_ms, base_tokens = ms, tokens
            same = tokens == base_tokens
            failed |= not same
            row = {"weights": weights, "pdl": pf is not None, "prefetch_bytes": pf,
                   "ms_per_token": round(ms, 4), "ratio_to_pdl_off": round(base_ms / ms, 4),
                   "tokens_equal": same}
            rows.append(row)
            print(json.dumps(row), flush=True)
    head = f"Batch-1 decode, {name}, {gpu_name()}, commit {project_commit()}: ms per token (median of {args.repeats})"
    lines = [head, "", "| weights | PDL | GEMV prefetch (bytes/program) | ms/token | speed-up vs PDL off | tokens equal |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['weights']} | {'on' if r['pdl'] else 'off'} | {r['prefetch_bytes'] if r['pdl'] else '-'} "
              f"| {r['ms_per_token']} | {r['ratio_to_pdl_off']} | {r['tokens_equal']} |" for r in rows]
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{datetime.date.today()}_pdl_{name}_{gpu_name()}")
    with open(stem + ".json", "w") as f:
        json.dump({"model": name, "gpu": gpu_name(), "commit": project_commit(), "rows": rows}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
