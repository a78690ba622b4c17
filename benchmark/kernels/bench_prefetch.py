"""The o projection's FP8 GEMV with its weight pulled into L2 during an idle window (``prefetch.py``).

    python benchmark/kernels/bench_prefetch.py [--out DIR]

A batch-1 layer of Qwen3-8B with FP8 weights, reduced to what matters here: the QKV GEMV, an idle
window standing for RoPE and the two attention stages (a spin kernel of ``window`` us, HBM idle),
then the o GEMV. One CUDA graph runs 36 such layers over distinct weights (L2-cold, as a decode
step), timed per layer with and without ``prefetch_l2`` of the o weight after the QKV GEMV (its
side stream joined before the o GEMV, or once after the last layer), for several windows.
``gain`` is the same-run difference per layer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import gpu_name  # noqa: E402
from minisgl.kernel.triton import prefetch  # noqa: E402
from minisgl.kernel.triton.fp8_gemv import fp8_gemv  # noqa: E402
from minisgl.quant import quantize_channel  # noqa: E402

LAYERS = 36
HIDDEN, QKV = 4096, 6144


def spin_cycles_per_us() -> float:
    """``torch.cuda._sleep``'s cycles per microsecond on this GPU, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    torch.cuda.synchronize()
    return 2_000_000 / (start.elapsed_time(end) * 1000)


def fp8_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    return quantize_channel(w)


def time_step(layers, x, cycles: int, mode: str) -> float:
    """Microseconds per layer of one graph replay (median of 7). ``mode``: none; early (the side
    stream joined before the o GEMV); late (joined once, after the last layer)."""

    def step():
        h = x
        for (wq, sq), (wo, so) in layers:
            qkv = fp8_gemv(h, wq, sq, None)
            if mode != "none":
                prefetch.prefetch_l2(wo)
            if cycles:
                torch.cuda._sleep(cycles)
            if mode == "early":
                prefetch.join_prefetches(h)
            h = fp8_gemv(qkv[:, :HIDDEN].contiguous(), wo, so, None)
        prefetch.join_prefetches(h)
        return h

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(7):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(layers))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmark/kernels/results")
    args = parser.parse_args()
    torch.manual_seed(0)
    layers = [(fp8_weight(QKV, HIDDEN), fp8_weight(HIDDEN, HIDDEN)) for _ in range(LAYERS)]
    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    per_us = spin_cycles_per_us()
    rows = []
    for window in (0, 4, 8, 12):
        cycles = int(window * per_us)
        base = time_step(layers, x, cycles, "none")
        for mode in ("early", "late"):
            t = time_step(layers, x, cycles, mode)
            rows.append({"window_us": window, "mode": mode, "layer_us": round(t, 2),
                         "no_prefetch_us": round(base, 2), "gain_us": round(base - t, 2)})
            print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    stem = f"{datetime.date.today()}_prefetch_{gpu_name()}"
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"gpu": gpu_name(), "spin_cycles_per_us": per_us, "rows": rows}, f, indent=1)
    lines = ["| window (us) | join | layer, prefetch (us) | layer, none (us) | gain (us) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['window_us']} | {r['mode']} | {r['layer_us']} | {r['no_prefetch_us']} | "
              f"{r['gain_us']} |" for r in rows]
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
