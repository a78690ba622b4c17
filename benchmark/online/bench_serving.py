"""Online serving benchmark against any OpenAI-compatible server (streaming /v1/completions).

    python -m minisgl --port 1919 &
    python benchmark/online/bench_serving.py --dataset random --num-prompts 100 \
        --input-len 32,256 --output-len 16,64 --request-rates 1,2,4
    python benchmark/online/bench_serving.py --dataset shared-prefix --groups 4 --per-group 8 \
        --prefix-len 512 --question-len 32 --output-len 16 --tag shared_prefix_radix
    python benchmark/online/bench_serving.py --dataset trace --trace-scale 0.5
    python benchmark/online/bench_serving.py --input-len 512,1024 --output-len 128,256 \
        --concurrencies 4,16,64 --rounds 4 --tag itl   # streaming smoothness at fixed concurrency
    python benchmark/online/bench_serving.py --compare bench-out/a.json bench-out/b.json \
        --tag a_vs_b

Writes ``<tag>.json``, ``<tag>.md`` and plots to ``--out``; with several ``--request-rates``,
``<tag>_rates.png`` shows the latency percentiles against the rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

from minisgl.benchmark import (  # noqa: E402
    ClientConfig,
    compare,
    load_trace,
    random_requests,
    run_benchmark,
    shared_prefix_requests,
    trace_requests,
    write_reports,
)
from minisgl.benchmark.report import ignore_eos_note  # noqa: E402
from minisgl.utils.heap import freeze_heap  # noqa: E402


def _range(text: str) -> tuple[int, int]:
    """``"N"`` or ``"MIN,MAX"`` (inclusive)."""
    parts = [int(p) for p in text.split(",")]
    if len(parts) not in (1, 2):
        raise argparse.ArgumentTypeError(f"expected N or MIN,MAX, got {text!r}")
    return (parts[0], parts[-1])


def _rates(text: str) -> list[float]:
    return [math.inf if p.strip() == "inf" else float(p) for p in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = p.add_argument
    add("--base-url", default="http://127.0.0.1:1919", help="server root (with or without /v1)")
    add("--model", help="model name (default: the first of /v1/models)")
    add("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    add("--dataset", choices=("random", "shared-prefix", "trace"), default="random")
    add("--num-prompts", type=int, default=100, help="random: requests")
    add("--prompt-kind", choices=("ids", "words"), default="ids",
        help="token-id prompts (exact lengths) or random words (any tokenizer)")
    add("--input-len", type=_range, default=(32, 256), help="random: prompt tokens, N or MIN,MAX")
    add("--output-len", type=_range, default=(16, 64), help="output tokens, N or MIN,MAX")
    add("--groups", type=int, default=4, help="shared-prefix: system prompts")
    add("--per-group", type=int, default=8, help="shared-prefix: questions per system prompt")
    add("--prefix-len", type=int, default=512, help="shared-prefix: system prompt tokens")
    add("--question-len", type=int, default=32, help="shared-prefix: question tokens")
    add("--trace", default=os.path.join(HERE, "sample_trace.jsonl"), help="trace: JSONL file")
    add("--trace-scale", type=float, default=1.0, help="trace: multiply its times (0.5: 2x rate)")
    add("--trace-time-unit", choices=("s", "ms"), default="s", help="trace: timestamp unit")
    add("--trace-block-size", type=int, default=16, help="trace: tokens per hash_ids block")
    add("--max-requests", type=int, help="trace: use only the first N records")
    add("--request-rates", type=_rates, default=[math.inf],
        help="comma-separated request rates (req/s, Poisson); inf: all at once")
    add("--max-concurrency", type=int, help="at most this many requests in flight")
    add("--concurrencies", type=lambda t: [int(p) for p in t.split(",")],
        help="comma-separated: one run per concurrency, all requests sent at once and at most that "
             "many in flight (replaces --request-rates and --max-concurrency)")
    add("--rounds", type=int, help="with --concurrencies: send ROUNDS x concurrency requests per "
                                   "run (default: --num-prompts)")
    add("--temperature", type=float, default=0.0)
    add("--no-ignore-eos", action="store_true", help="do not send ignore_eos")
    add("--warmup", type=int, default=1, help="unmeasured requests sent first")
    add("--seed", type=int, default=0)
    add("--out", default="bench-out", help="results (./bench-out)")
    add("--tag", help="file name stem of the results (default: the dataset)")
    add("--no-progress", action="store_true")
    add("--compare", nargs=2, metavar=("A_JSON", "B_JSON"),
        help="write a table of A's and B's first runs with the ratio A/B, then exit")
    return p


def make_requests(args: argparse.Namespace, seed: int, num: int | None = None) -> tuple[list, dict]:
    """The workload drawn with ``seed`` (random: ``num`` prompts, default ``--num-prompts``), and
    its description for the JSON result."""
    kind = args.prompt_kind
    if args.dataset == "random":
        reqs = random_requests(num or args.num_prompts, args.input_len, args.output_len, seed, kind)
        meta = {"num_prompts": args.num_prompts, "input_len": list(args.input_len)}
    elif args.dataset == "shared-prefix":
        reqs = shared_prefix_requests(args.groups, args.per_group, args.prefix_len,
                                      args.question_len, args.output_len, seed, kind)
        meta = {"groups": args.groups, "per_group": args.per_group,
                "prefix_len": args.prefix_len, "question_len": args.question_len}
    else:
        unit = 0.001 if args.trace_time_unit == "ms" else 1.0
        reqs = trace_requests(load_trace(args.trace), args.trace_scale, unit,
                              args.trace_block_size, seed, kind, args.max_requests)
        meta = {"trace": os.path.relpath(args.trace), "trace_scale": args.trace_scale,
                "requests": len(reqs)}
    if args.dataset != "trace":
        meta["output_len"] = list(args.output_len)
    return reqs, {"name": args.dataset, "prompt_kind": kind, "seed": args.seed, **meta}


def run_all(args: argparse.Namespace, cfg: ClientConfig) -> list[dict]:
    """The warm-up, then one run per rate. Each draws its own prompts (seed + run index), so a
    prefix cache cannot serve one run from what an earlier one left behind."""
    if args.warmup:
        warm = make_requests(args, args.seed + 1000)[0][: args.warmup]
        warm = [dataclasses.replace(r, output_len=4, arrival=None) for r in warm]
        run_benchmark(warm, dataclasses.replace(cfg, progress=False))
    runs = []
    rates = [math.inf] if args.dataset == "trace" else args.request_rates
    plan = [(rate, cfg, None) for rate in rates]
    if args.concurrencies:
        plan = [(math.inf, dataclasses.replace(cfg, max_concurrency=c),
                 c * args.rounds if args.rounds else None) for c in args.concurrencies]
    for i, (rate, run_cfg, num) in enumerate(plan):
        run = run_benchmark(make_requests(args, args.seed + i, num)[0], run_cfg, rate)
        run["dataset_seed"] = args.seed + i
        runs.append(run)
        print(f"rate {rate}, concurrency {run_cfg.max_concurrency}: {run['completed']} done, "
              f"{run['failed']} failed in {run['duration_s']:.1f} s, "
              f"{run['output_throughput']:.1f} output tok/s, "
              f"mean TTFT {run['ttft_ms']['mean']:.1f} ms, "
              f"mean TPOT {run['tpot_ms']['mean']:.1f} ms, ITL "
              f"median {run['itl_ms']['p50']:.1f} / P99 {run['itl_ms']['p99']:.1f} / max "
              f"{run['itl_ms']['max']:.1f} ms")
        for error in run["errors"]:
            print("  error:", error)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tag = args.tag or args.dataset.replace("-", "_")
    if args.compare:
        a, b = (json.load(open(path)) for path in args.compare)
        table = compare(a, b)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, tag + ".md"), "w") as f:
            f.write(f"### {tag}\n\n{table}")
        print(table)
        return 0
    dataset = make_requests(args, args.seed)[1]
    cfg = ClientConfig(base_url=args.base_url, model=args.model, api_key=args.api_key,
                       max_concurrency=args.max_concurrency, ignore_eos=not args.no_ignore_eos,
                       temperature=args.temperature, seed=args.seed,
                       progress=not args.no_progress)
    freeze_heap()  # a full collection over the client's heap would show as a gap between tokens
    try:
        runs = run_all(args, cfg)
    except httpx.HTTPError as e:
        print(f"error: cannot use the server at {cfg.base_url}: {e}", file=sys.stderr)
        return 1
    result = {"tag": tag, "created": datetime.datetime.now().isoformat(timespec="seconds"),
              "base_url": cfg.base_url, "model": runs[0]["model"], "dataset": dataset,
              "client": {"ignore_eos": cfg.ignore_eos, "temperature": cfg.temperature,
                         "max_concurrency": cfg.max_concurrency, "warmup": args.warmup,
                         "endpoint": "/v1/completions (stream, include_usage)",
                         "ignore_eos_sent_as": "an extra body field (not part of OpenAI's API)"},
              "ignore_eos_note": ignore_eos_note(runs), "runs": runs}
    for path in write_reports(result, args.out):
        print("wrote", os.path.relpath(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
