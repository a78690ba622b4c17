"""Fused Triton MoE vs the torch reference backend on the Qwen3-30B-A3B expert shape, bf16, or
(``--mxfp4``) on gpt-oss-20b's MXFP4 experts (32 x 2880 x 2880, top 4, biases, clamped SwiGLU).

    python benchmark/kernels/bench_moe.py [--tokens 1 16 256 4096] [--sweep] [--mxfp4] [--kernels]
        [--once] [--out DIR]

Per token count: the fused kernel eagerly and replayed from a CUDA graph (how decode runs it), and
the torch backend (eager only: it reads expert counts back to the host). TFLOP/s counts the active
FLOPs, 6 * T * top_k * H * I (three GEMMs per routed pair); GB/s is the graph time against the bytes
of the experts actually hit, the floor when decode is weight-bandwidth bound. Times are medians from
``triton.testing.do_bench``, which flushes L2 between runs. ``--sweep`` also times a few block
configurations per token count (CUDA-graph replays), to guide ``pick_config``. Writes JSON and
markdown named ``<date>_moe_<gpu>.{json,md}``. ``--once`` runs the fused MoE twice per token count
(the first call compiles), times nothing and writes nothing: a program for ``ncu`` to profile
(``scripts/gpu_validate.sh moe-ncu``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from dataclasses import asdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import triton
from triton.testing import do_bench

import minisgl.models  # noqa: F401  (first: importing minisgl.layers alone is circular)
from minisgl.kernel.triton.fused_moe import MoeConfig, fused_moe, pick_config
from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales
from minisgl.moe.reference import TorchMoeBackend
from minisgl.quant.mxfp4 import quantize_mxfp4, to_words

H, INTER, E, K = 2048, 768, 128, 8  # Qwen3-30B-A3B: hidden, moe_intermediate, experts, top-k

SWEEP = {  # (block_m, block_n1, block_n2, block_k, group_m, num_warps, num_stages)
    "decode": [(16, 32, 64, 256, 1, 4, 3), (16, 64, 64, 128, 1, 4, 4), (16, 32, 32, 256, 1, 4, 3),
               (16, 32, 64, 128, 1, 4, 4), (16, 16, 64, 256, 1, 4, 3), (16, 32, 128, 256, 1, 4, 3)],
    "mid": [(32, 64, 64, 128, 4, 4, 4), (16, 64, 64, 128, 1, 4, 4), (16, 32, 64, 256, 1, 4, 3),
            (32, 32, 64, 256, 4, 4, 3), (32, 64, 128, 128, 4, 4, 3), (64, 64, 128, 64, 8, 4, 4)],
    "prefill": [(128, 128, 128, 64, 8, 8, 3), (128, 128, 256, 64, 8, 8, 3),
                (128, 128, 128, 64, 8, 8, 4), (128, 128, 128, 64, 4, 8, 3),
                (64, 128, 128, 64, 8, 4, 3), (128, 128, 128, 32, 8, 8, 4)],
}


def inputs(tokens: int, seed: int = 0, mx: bool = False) -> tuple[tuple, dict]:
    """(fused_moe's positional arguments, its keywords) for ``tokens`` routed tokens; MXFP4
    experts in the word layout ``fused_moe`` reads (``quant.mxfp4.to_words``)."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*s):
        return torch.randn(*s, generator=g, device="cuda")

    x = randn(tokens, H).bfloat16()
    w13, w2 = randn(E, 2 * INTER, H) / H**0.5, randn(E, H, INTER) / INTER**0.5
    weights, ids = torch.topk(randn(tokens, E).softmax(-1), K, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).bfloat16()
    if not mx:
        return (x, w13.bfloat16(), w2.bfloat16(), weights, ids), {}
    (w13, s13), (w2, s2) = quantize_mxfp4(w13), quantize_mxfp4(w2)
    bias = ExpertBias((randn(E, 2 * INTER) * 0.1).bfloat16(), (randn(E, H) * 0.1).bfloat16())
    return (x, to_words(w13), to_words(w2), weights, ids), dict(
        scales=Mxfp4Scales(s13, s2), bias=bias, act=MoeActivation("swiglu_clamped", 1.702, 7.0))


def config(tokens: int, mx: bool) -> MoeConfig:
    """The tiles ``fused_moe`` picks for ``tokens`` (this GPU's table where there is one)."""
    key = ("mxfp4" if mx else "bf16", 2 * INTER, H)
    return pick_config(tokens * K, E, mx, key, torch.device("cuda"))


def graph_ms(fn) -> float:
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, return_mode="median")


def sweep(tokens: int, args, kw, deadline: float) -> list[dict]:
    kind = "decode" if tokens * K / E <= 4 else "mid" if tokens * K / E <= 32 else "prefill"
    rows = []
    for c in SWEEP[kind]:
        if time.time() > deadline:
            break
        cfg = MoeConfig(*c)
        try:
            ms = graph_ms(lambda: fused_moe(*args, config=cfg, **kw))
            rows.append(dict(config=asdict(cfg), ms=ms))
        except Exception as e:  # e.g. out of shared memory
            rows.append(dict(config=asdict(cfg), error=f"{type(e).__name__}: {e}"[:200]))
    return rows


def kernel_times(fn, reps: int = 20) -> dict[str, float]:
    """The device time of each kernel ``fn`` launches, microseconds a call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.device_time_total > 0:
            times[e.key[:60]] = round(e.device_time_total / reps, 1)
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 256, 4096])
    p.add_argument("--out", default="bench-out", help="results (./bench-out)")
    p.add_argument("--sweep", action="store_true", help="also time a few block configurations")
    p.add_argument("--sweep-budget", type=float, default=100.0, help="seconds for the whole sweep")
    p.add_argument("--no-torch", action="store_true", help="skip the torch reference backend")
    p.add_argument("--mxfp4", action="store_true", help="gpt-oss-20b's MXFP4 experts")
    p.add_argument("--kernels", action="store_true",
                   help="also each kernel's device time per call (torch.profiler)")
    p.add_argument("--once", action="store_true", help="each token count run, not timed (ncu)")
    a = p.parse_args()
    global H, INTER, E, K
    if a.mxfp4:
        H, INTER, E, K = 2880, 2880, 32, 4
    if a.once:
        for tokens in a.tokens:
            args, kw = inputs(tokens, mx=a.mxfp4)
            for _ in range(2):
                fused_moe(*args, **kw)
            torch.cuda.synchronize()
            print(tokens, "tokens:", config(tokens, a.mxfp4))
        return
    weight_bytes = 17 / 32 if a.mxfp4 else 2  # MXFP4: 16 bytes of values and a scale per 32
    gpu = torch.cuda.get_device_name()
    results = []
    for tokens in a.tokens:
        args, kw = inputs(tokens, mx=a.mxfp4)
        flops = 6 * tokens * K * H * INTER
        hit = int(args[4].unique().numel())
        fused = do_bench(lambda: fused_moe(*args, **kw), return_mode="median")
        graphed = graph_ms(lambda: fused_moe(*args, **kw))
        # timed only: on MXFP4 it reads the word layout as standard bytes (the same work)
        ref = None if a.no_torch else do_bench(lambda: TorchMoeBackend().forward(*args, **kw),
                                               return_mode="median")
        cfg = config(tokens, a.mxfp4)
        row = dict(tokens=tokens, experts_hit=hit, config=asdict(cfg),
                   fused_ms=fused, fused_graph_ms=graphed, torch_ms=ref,
                   fused_tflops=flops / fused / 1e9, fused_graph_tflops=flops / graphed / 1e9,
                   torch_tflops=flops / ref / 1e9 if ref else None,
                   speedup=ref / fused if ref else None,
                   graph_weight_gbps=hit * 3 * H * INTER * weight_bytes / graphed / 1e6)
        if a.kernels:
            row["kernels_us"] = kernel_times(lambda: fused_moe(*args, **kw))
        print(json.dumps(row), flush=True)
        results.append(row)
    if a.sweep:
        deadline = time.time() + a.sweep_budget
        for row in results:
            row["sweep"] = sweep(row["tokens"], *inputs(row["tokens"], mx=a.mxfp4), deadline)
            best = min((r for r in row["sweep"] if "ms" in r), key=lambda r: r["ms"], default=None)
            print(f"T={row['tokens']}: best {best}", flush=True)
    date = datetime.date.today().isoformat()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    meta = dict(gpu=gpu, date=date, torch=torch.__version__, triton=triton.__version__,
                shape=dict(hidden=H, moe_intermediate=INTER, experts=E, top_k=K), dtype="bfloat16")
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"{date}_moe{'_mxfp4' if a.mxfp4 else ''}_{slug}")
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    lines = [f"# Fused MoE vs torch reference: {gpu}, {date}", "",
             f"{'gpt-oss-20b MXFP4' if a.mxfp4 else 'Qwen3-30B-A3B'} experts (H={H}, I={INTER}, "
             f"E={E}, top-{K}), bf16 activations, "
             f"torch {torch.__version__}, triton {triton.__version__}. Median ms (L2 flushed); "
             "TFLOP/s of active FLOPs.", "",
             "| T | experts hit | fused ms | fused (graph) ms | torch ms | speedup | "
             "fused TFLOP/s | graph TFLOP/s | graph weight GB/s |", "|---" * 9 + "|"]
    for r in results:
        t = "-" if r["torch_ms"] is None else f"{r['torch_ms']:.3f}"
        s = "-" if r["speedup"] is None else f"{r['speedup']:.1f}x"
        lines.append(f"| {r['tokens']} | {r['experts_hit']} | {r['fused_ms']:.3f} | "
                     f"{r['fused_graph_ms']:.3f} | {t} | {s} | {r['fused_tflops']:.1f} | "
                     f"{r['fused_graph_tflops']:.1f} | {r['graph_weight_gbps']:.0f} |")
    if a.sweep:
        lines += ["", "Sweep (CUDA-graph ms; config = block_m, block_n1, block_n2, block_k, "
                  "group_m, warps, stages):", "", "| T | config | ms |", "|---|---|---|"]
        lines += [f"| {r['tokens']} | {tuple(sw['config'].values())} | "
                  f"{sw['ms']:.3f} |" if "ms" in sw else f"| {r['tokens']} | "
                  f"{tuple(sw['config'].values())} | {sw['error'][:60]} |"
                  for r in results for sw in r.get("sweep", [])]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
