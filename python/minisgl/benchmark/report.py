"""Reports of a benchmark invocation: a JSON result, a markdown table and matplotlib plots."""

from __future__ import annotations

import json
import math
import os
from typing import Any

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))


def jsonable(x: Any) -> Any:
    """JSON has no inf/nan: a rate of inf becomes "inf", a statistic of no values null."""
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x == math.inf else None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


def ignore_eos_note(runs: list[dict]) -> str | None:
    early = sum(r["early_stops"] for r in runs)
    if not early:
        return None
    done = sum(r["completed"] for r in runs)
    return (f"{early} of {done} requests ended before max_tokens: the server may ignore "
            "'ignore_eos' (sent as an extra body field), so output lengths were not forced")


def _num(x: Any, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "inf" if x == math.inf or x == "inf" else "-"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def markdown(result: dict) -> str:
    """One row per run; latencies in ms as mean / p50 / p90 / p99."""
    head = ["rate (req/s)", "concurrency", "done", "failed", "duration (s)", "req/s", "input tok/s",
            "output tok/s", *(f"{name} mean / p50 / p90 / p99 (ms)" for _, name in LATENCIES)]
    lines = [f"### {result['tag']}", "",
             f"{result['model']} at {result['base_url']}; dataset `{result['dataset']['name']}`"
             f" ({', '.join(f'{k}={v}' for k, v in result['dataset'].items() if k != 'name')})", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in result["runs"]:
        cells = [_num(run["request_rate"]), _num(run["max_concurrency"]), _num(run["completed"]),
                 _num(run["failed"]), _num(run["duration_s"], 2),
                 _num(run["request_throughput"], 2), _num(run["input_throughput"]),
                 _num(run["output_throughput"])]
        cells += [" / ".join(_num(run[key][s]) for s in ("mean", "p50", "p90", "p99"))
                  for key, _ in LATENCIES]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *streaming_table(result["runs"])]
    if result.get("ignore_eos_note"):
        lines += ["", f"Note: {result['ignore_eos_note']}."]
    return "\n".join(lines) + "\n"


def streaming_table(runs: list[dict]) -> list[str]:
    """What a user watching a stream sees, one row per run: output throughput, the inter-token
    latency's median, P99 and maximum (a frozen stream), and TTFT's mean and P99."""
    head = ["concurrency", "rate (req/s)", "output tok/s", "median ITL (ms)", "P99 ITL (ms)",
            "max ITL (ms)", "P99/median ITL", "mean TTFT (ms)", "P99 TTFT (ms)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        itl, ttft = run["itl_ms"], run["ttft_ms"]
        spread = itl["p99"] / itl["p50"] if _finite(itl["p50"]) and itl["p50"] else None
        cells = [_num(run["max_concurrency"]), _num(run["request_rate"]),
                 _num(run["output_throughput"]), _num(itl["p50"]), _num(itl["p99"]),
                 _num(itl.get("max")), _num(spread, 2), _num(ttft["mean"]), _num(ttft["p99"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def plot_rates(result: dict, path: str) -> bool:
    """Latency percentiles and throughput against the request rate (runs at finite rates only)."""
    runs = sorted((r for r in result["runs"] if _finite(r["request_rate"])),
                  key=lambda r: r["request_rate"])
    if len(runs) < 2:
        return False
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    rates = [r["request_rate"] for r in runs]
    for ax, (key, name) in zip(axes.flat, (LATENCIES[0], LATENCIES[1], LATENCIES[3])):
        for stat in ("p50", "p90", "p99"):
            ax.plot(rates, [r[key][stat] for r in runs], marker="o", label=stat)
        ax.set(title=f"{name} (ms)", xlabel="request rate (req/s)")
        ax.legend()
    ax = axes.flat[3]
    ax.plot(rates, [r["output_throughput"] for r in runs], marker="o", label="output")
    ax.plot(rates, [r["total_token_throughput"] for r in runs], marker="o", label="input + output")
    ax.set(title="throughput (tok/s)", xlabel="request rate (req/s)")
    ax.legend()
    return _save(fig, result, path)


def plot_cdf(result: dict, path: str) -> bool:
    """Per-request TTFT and end-to-end latency distributions, one curve per run."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for run in result["runs"]:
        rows = [r for r in run["requests"] if r["ok"]]
        for ax, key in zip(axes, ("ttft", "e2e")):
            values = sorted(r[key] * 1000 for r in rows)
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post",
                    label=_label(run))
    for ax, name in zip(axes, ("TTFT (ms)", "end-to-end latency (ms)")):
        ax.set(title=f"CDF of {name}", xlabel=name, ylabel="fraction of requests")
        ax.legend()
    return _save(fig, result, path)


def write_reports(result: dict, out_dir: str) -> list[str]:
    """Write ``<tag>.json``, ``<tag>.md``, ``<tag>_cdf.png`` and, with several rates,
    ``<tag>_rates.png``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, result["tag"])
    with open(base + ".json", "w") as f:
        json.dump(jsonable(result), f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(result))
    paths = [base + ".json", base + ".md"]
    paths += [p for p, plot in ((base + "_cdf.png", plot_cdf), (base + "_rates.png", plot_rates))
              if plot(result, p)]
    return paths


def compare(a: dict, b: dict) -> str:
    """A markdown table of two results' first runs side by side, with the ratio a / b."""
    ra, rb = a["runs"][0], b["runs"][0]
    rows = [("output tok/s", "output_throughput", None),
            ("total tok/s", "total_token_throughput", None), ("req/s", "request_throughput", None),
            ("mean TTFT (ms)", "ttft_ms", "mean"), ("p99 TTFT (ms)", "ttft_ms", "p99"),
            ("mean TPOT (ms)", "tpot_ms", "mean"), ("mean E2E (ms)", "e2e_ms", "mean")]
    lines = [f"| | {a['tag']} | {b['tag']} | ratio |", "|---|---|---|---|"]
    for name, key, stat in rows:
        x, y = (ra[key], rb[key]) if stat is None else (ra[key][stat], rb[key][stat])
        ratio = x / y if x is not None and y else None
        lines.append(f"| {name} | {_num(x)} | {_num(y)} | {_num(ratio, 2)}x |")
    return "\n".join(lines) + "\n"


def _label(run: dict) -> str:
    rate, limit = run["request_rate"], run.get("max_concurrency")
    text = "trace" if rate == "trace" else f"rate {_num(rate)}"
    return f"{text}, concurrency {limit}" if limit else text


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _save(fig, result: dict, path: str) -> bool:
    fig.suptitle(f"{result['tag']}: {result['model']}, dataset {result['dataset']['name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return True
