"""Compare schedule modes run on one machine: streaming smoothness against prefill-first.

    python benchmark/online/itl_summary.py --baseline out/qwen3-8b_H100_itl_prefill-first.json \
        out/qwen3-8b_H100_itl_mixed-*.json --max-itl-ms 250 --out out/qwen3-8b_H100_itl.md

One row per (result, concurrency): output tok/s and its ratio to the baseline at that concurrency,
median / P99 / max ITL, P99 over median, mean TTFT and its ratio, P99 TTFT; then whether the mode
meets the smoothness targets (P99 ITL <= 2.5x median, max ITL <= --max-itl-ms, throughput >= 0.97x
and mean TTFT <= 1.2x of the baseline; with --max-itl-only, Qwen3-0.6B's: max ITL and throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

TARGETS = {"spread": 2.5, "throughput": 0.97, "ttft": 1.2}


def _label(result: dict) -> str:
    return result["tag"].rsplit("_itl_", 1)[-1]


def rows(results: list[dict], baseline: dict, max_itl_ms: float | None,
         max_itl_only: bool = False) -> list[str]:
    base = {r["max_concurrency"]: r for r in baseline["runs"]}
    head = ["mode", "concurrency", "output tok/s", "vs baseline", "median ITL", "P99 ITL",
            "max ITL", "P99/median", "mean TTFT", "vs baseline", "P99 TTFT", "targets met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for result in [baseline, *results]:
        for run in result["runs"]:
            ref = base.get(run["max_concurrency"])
            itl, ttft = run["itl_ms"], run["ttft_ms"]
            tput = run["output_throughput"] / ref["output_throughput"] if ref else None
            slow = ttft["mean"] / ref["ttft_ms"]["mean"] if ref else None
            spread = itl["p99"] / itl["p50"]
            met = [] if max_itl_only else [spread <= TARGETS["spread"]]
            if max_itl_ms is not None:
                met.append(itl["max"] <= max_itl_ms)
            if result is not baseline and ref:
                met.append(tput >= TARGETS["throughput"])
                if not max_itl_only:
                    met.append(slow <= TARGETS["ttft"])
            cells = [_label(result), str(run["max_concurrency"]), f"{run['output_throughput']:.0f}",
                     f"{tput:.3f}x" if tput else "-", f"{itl['p50']:.1f}", f"{itl['p99']:.1f}",
                     f"{itl['max']:.0f}", f"{spread:.2f}", f"{ttft['mean']:.0f}",
                     f"{slow:.2f}x" if slow else "-", f"{ttft['p99']:.0f}",
                     "yes" if all(met) else "no"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("results", nargs="+",
                   help="bench_serving.py JSON results (--concurrencies runs)")
    p.add_argument("--baseline", required=True, help="prefill-first's result, same machine")
    p.add_argument("--max-itl-ms", type=float, help="target for the largest inter-token latency")
    p.add_argument("--max-itl-only", action="store_true",
                   help="targets: max ITL and throughput only (the Qwen3-0.6B criteria)")
    p.add_argument("--out", help="write the markdown table here as well")
    args = p.parse_args(argv)
    baseline = json.load(open(args.baseline))
    results = [json.load(open(path)) for path in args.results
               if os.path.abspath(path) != os.path.abspath(args.baseline)]
    model = baseline["model"]
    text = "\n".join([f"### {model}: schedule modes against {_label(baseline)} (latencies in ms)",
                      "", *rows(results, baseline, args.max_itl_ms, args.max_itl_only)]) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
