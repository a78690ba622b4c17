"""One token through the linear layers: the Triton GEMV (``kernel/triton/gemv.py``) against cuBLAS.

    python benchmark/kernels/bench_gemv.py [--sweep] [--out DIR]

Shapes are the linear layers of Qwen3-0.6B and Qwen3-8B (merged QKV, o, merged gate-up, down, LM
head) and gpt-oss-20b's dense ones (QKV, o, LM head), bf16. Each case is timed the way decode runs
it: a CUDA graph replays many calls back to back, cycling over enough copies of the weight that
none is still in L2 (decode streams every layer's weight once per step). TB/s counts the weight
bytes; ``ratio`` is cuBLAS time / Triton time.
``--sweep`` also times a grid of (block_n, block_k, num_warps) per case, to guide ``pick_config``.
Writes JSON and markdown named ``<date>_gemv_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import gpu_name  # noqa: E402

from minisgl.kernel.triton.activation import silu_and_mul  # noqa: E402
from minisgl.kernel.triton.gemv import gemv, pick_config  # noqa: E402

SHAPES = {  # (N, K) of nn.Linear weights
    "qwen3-0.6b": {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024),
                   "down": (1024, 3072), "lm_head": (151936, 1024)},
    "qwen3-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096),
                 "down": (4096, 12288), "lm_head": (151936, 4096)},
    # K = 2,880 is no multiple of a power-of-two chunk: every chunk masked
    "gpt-oss-20b": {"qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)},
}
SWEEP = list(itertools.product([2, 4, 8], [512, 1024, 2048, 4096], [4, 8]))
L2_FLUSH_BYTES = 512 << 20  # the weights cycled through in one replay: far more than any L2


def time_graph(fn, weights: list[torch.Tensor], x: torch.Tensor, calls: int = 64) -> float:
    """Seconds per call: one CUDA graph of ``calls`` back-to-back calls over rotating weights."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for w in weights[:2]:
            fn(x, w)  # compile / pick algorithms outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(x, weights[i % len(weights)])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    args = parser.parse_args()

    gpu = gpu_name()
    records = []
    for model, layers in SHAPES.items():
        for layer, (n, k) in layers.items():
            nbytes = n * k * 2
            copies = max(2, min(64, L2_FLUSH_BYTES // nbytes))
            weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                       for _ in range(copies)]
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, weights[0])
            err = (gemv(x, weights[0]) - ref).abs().max().item() / ref.abs().max().item()
            t_cublas = time_graph(F.linear, weights, x)
            t_triton = time_graph(gemv, weights, x)
            rec = {"model": model, "layer": layer, "n": n, "k": k,
                   "config": list(pick_config(n, k)),
                   "rel_err": round(err, 5), "cublas_us": round(t_cublas * 1e6, 2),
                   "triton_us": round(t_triton * 1e6, 2),
                   "cublas_tb_s": round(nbytes / t_cublas / 1e12, 3),
                   "triton_tb_s": round(nbytes / t_triton / 1e12, 3),
                   "ratio": round(t_cublas / t_triton, 3)}
            if layer == "down":  # the MLP's real pair: silu-and-mul then the down projection
                h = torch.randn(1, 2 * k, device="cuda", dtype=torch.bfloat16)
                rec["gated_cublas_us"] = round(1e6 * time_graph(
                    lambda a, b: F.linear(silu_and_mul(a), b), weights, h), 2)
                rec["gated_triton_us"] = round(1e6 * time_graph(
                    lambda a, b: gemv(a, b, gated=True), weights, h), 2)
            if args.sweep:
                sweep = {cfg: time_graph(lambda a, b, c=cfg: gemv(a, b, config=c), weights, x)
                         for cfg in SWEEP}
                best = min(sweep, key=sweep.get)
                rec["best_config"], rec["best_tb_s"] = (
                    list(best), round(nbytes / sweep[best] / 1e12, 3))
            records.append(rec)
            print(json.dumps(rec), flush=True)
            del weights
            torch.cuda.empty_cache()

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{datetime.date.today().isoformat()}_gemv_{gpu}")
    with open(stem + ".json", "w") as f:
        json.dump(records, f, indent=1)
    lines = [f"One token through the linear layers, bf16, {torch.cuda.get_device_name()}: "
             "cuBLAS (F.linear) vs the Triton GEMV, CUDA-graph replays over L2-cold weights. "
             "Gated: silu-and-mul then down (cuBLAS: two kernels) vs the GEMV reading "
             "[gate | up].", "",
             "| model | layer | N x K | cuBLAS us | cuBLAS TB/s | Triton us | Triton TB/s | "
             "ratio | gated: cuBLAS us / Triton us | best swept (bn, bk, warps): TB/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        best = f"{tuple(r['best_config'])}: {r['best_tb_s']}" if "best_config" in r else ""
        gated = f"{r['gated_cublas_us']} / {r['gated_triton_us']}" if "gated_cublas_us" in r else ""
        lines.append(f"| {r['model']} | {r['layer']} | {r['n']} x {r['k']} | {r['cublas_us']} | "
                     f"{r['cublas_tb_s']} | {r['triton_us']} | {r['triton_tb_s']} | {r['ratio']} | "
                     f"{gated} | {best} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
