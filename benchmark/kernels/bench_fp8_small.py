"""Batched decode (2..256 tokens) through Qwen3-8B's FP8 layers: the W8A16 and W8A8 GEMMs
(``kernel/triton/fp8_w8a16.py``) against ``torch._scaled_mm``, ``fp8_linear`` and bf16 cuBLAS.

    python benchmark/kernels/bench_fp8_small.py [--sweep w8a16|w8a8] [--out DIR]

Per layer (qkv, o, gate_up; down reads ``[gate | up]`` and applies SiLU-and-mul) and token count M,
all with per-output-channel e4m3 weights (``--quantization fp8``):

* ``w8a16``: the W8A16 kernel with ``pick_config``'s tiles (bf16 x, no activation quantization);
* ``w8a8``: per-token quantization + the same kernel on e4m3 x (FP8 tensor cores, split-K);
* ``scaled_mm``: per-token quantization (``fp8_quant.quantize_tokens``) + ``torch._scaled_mm``, what
  ``quant.fp8_dispatch`` runs for M >= 2 before the W8A16 kernel; ``fp8_linear``: whatever
  ``quant.fp8_dispatch.fp8_linear`` dispatches to today;
* ``bf16``: cuBLAS ``F.linear`` on bf16 weights (down: after the SiLU-and-mul kernel).

Each case is timed as decode runs it: a CUDA graph replays many calls over enough weight copies that
none stays in L2. TB/s counts the weight bytes (e4m3: N*K; bf16: 2*N*K); ``floor_us`` is the e4m3
weight over the bandwidth of a large device-to-device copy. ``rel_err``: max error against fp32
``x @ dequant(w)^T`` on the unquantized x (so ``scaled_mm``'s includes its activation rounding) over
the largest reference magnitude. ``--sweep KIND`` times a grid of configs of one kernel form at a
few M (compiled first in parallel processes) and records the best per (layer, M), to fit
``pick_config``.
Writes ``<date>_fp8_small_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import itertools
import json
import multiprocessing
import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))
sys.path.insert(0, os.path.dirname(__file__))

from bench_common import gpu_name  # noqa: E402
from bench_fp8 import channel_weights, copy_bandwidth  # noqa: E402
from bench_gemv import L2_FLUSH_BYTES, time_graph  # noqa: E402

from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm, fp8_w8a16_gemm  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16_config import W8A16Config, pick_config  # noqa: E402
from minisgl.layers.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from minisgl.quant.fp8 import dequantize_channel  # noqa: E402
from minisgl.quant.fp8_dispatch import fp8_linear  # noqa: E402

LAYERS = {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up": (24576, 4096, False),
          "down": (4096, 12288, True)}  # (N, K, gated input)
TOKENS = [2, 4, 8, 12, 16, 24, 32, 64, 96, 128, 192, 256]
SWEEP_TOKENS = {"w8a16": [4, 16, 64, 128], "w8a8": [64, 128, 256], "w8a8-wide": [64, 128, 256],
                "w8a8-small": [8, 16, 32, 48]}
W8A8_TOKENS = 2  # the W8A8 form is timed from this many tokens on
SMEM = 227 * 1024  # an H100's shared memory per block


def sweep_configs(kind: str, m: int, n: int, k: int, gated: bool) -> list[W8A16Config]:
    """block_n x block_k x warps x stages x split_k, minus what cannot help: 8 warps below 128 rows,
    tiles over the shared memory, splits of fewer than 2 K steps or beyond ~4 programs per SM.
    The W8A8 form reads x quantized (one byte, SiLU-and-mul already applied); its grid is the
    M tile (16 up to the token count: more programs for the layers with few rows) x 128- or
    256-deep K steps x stages, with 64-row N tiles and 4 warps, unsplit (its first sweep's
    best for qkv, o and down; ``--sweep w8a8-wide`` reruns that one). ``w8a8-small`` (8-48 tokens)
    adds 32- and 128-row N tiles and split K, for the layers whose tiles leave SMs idle."""
    block_m = pick_config(m, n, k, gated).block_m
    if kind == "w8a8-small":
        out = []
        for bm, bn, bk, stages, split in itertools.product(
                [16, 32, 64], [32, 64, 128], [128, 256], [3, 4, 5], [1, 2, 4]):
            programs = triton.cdiv(n, bn) * triton.cdiv(m, bm) * split
            if bm > max(16, triton.next_power_of_2(m)) or programs > 4 * 132:
                continue
            out.append(W8A16Config(bm, bn, bk, split, 8 if bn == 128 else 4, stages))
        return out
    if kind == "w8a8":
        return [W8A16Config(bm, 64, bk, 1, 4, stages)
                for bm, bk, stages in itertools.product([16, 32, 64, 128], [128, 256], [3, 4, 5])
                if bm <= block_m]
    elem, gated = (1, False) if kind == "w8a8-wide" else (2, gated)
    out = []
    for bn, bk, warps, stages, split in itertools.product(
            [32, 64, 128], [128, 256], [4, 8], [3, 4, 5], [1, 2, 4]):
        x_bytes = block_m * bk * elem
        smem = (stages - 1) * (bn * bk + x_bytes * (2 if gated else 1)) + x_bytes
        programs = triton.cdiv(n, bn) * triton.cdiv(m, block_m) * split
        if (warps == 8 and bn < 128 or smem > SMEM or k // (bk * split) < 2
                or split > 1 and programs > 4 * 132):
            continue
        out.append(W8A16Config(block_m, bn, bk, split, warps, stages))
    return out


_WORKER: dict = {}


def run(kind: str, x: torch.Tensor, w: tuple, gated: bool, config: W8A16Config | None = None):
    """One layer call of a kernel form: ``w8a16`` on bf16 x; ``w8a8`` (and ``w8a8-wide``, the same
    kernel) quantizes x per token first."""
    if kind == "w8a16":
        return fp8_w8a16_gemm(x, w[0], w[1], None, gated=gated, config=config)
    q, s = quantize_tokens(x, gated)
    return fp8_w8a8_gemm(q, s, w[0], w[1], out_dtype=x.dtype, config=config)


def _compile(task) -> bool:
    """In a worker process: one call at the case's exact shapes compiles the variant into Triton's
    on-disk cache, which the timing process then reads. False: it does not fit (shared memory)."""
    kind, m, n, k, gated, cfg = task
    if (n, k) not in _WORKER:
        _WORKER[(n, k)] = (torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn),
                           torch.rand(n, 1, device="cuda"))
    x = torch.randn(m, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
    try:
        run(kind, x, _WORKER[(n, k)], gated, cfg)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001  (OutOfResources and the like: the config is skipped)
        return False


def compile_key(kind: str, m: int, n: int, k: int, gated: bool, cfg: W8A16Config) -> tuple:
    """What Triton compiles a variant for: the layers' N only matter through N % 16 (all 0),
    M through M % 16, split_k through split_k > 1."""
    return kind, m, k, gated, dataclasses.replace(cfg, split_k=min(cfg.split_k, 2))


def precompile(cases: list) -> dict[tuple, bool]:
    """Every distinct variant of ``cases`` ((layer, kind, m, n, k, gated, cfg)) compiled in
    parallel."""
    tasks = {compile_key(*case[1:]): case[1:] for case in cases}
    workers = min(12, max(1, (os.cpu_count() or 2) - 2))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return dict(zip(tasks, pool.map(_compile, tasks.values(), chunksize=2), strict=True))


def bench_layer(layer: str, n: int, k: int, gated: bool, peak: float, sweep: dict,
                kind: str | None) -> list[dict]:
    copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
    wc = channel_weights(n, k, copies)
    w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
           for _ in range(max(2, copies // 2))]
    wd = dequantize_channel(*wc[0])
    records = []
    for m in TOKENS:
        x = torch.randn(m, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
        ref = (silu_and_mul_ref(x) if gated else x).float() @ wd.T

        def err(y, ref=ref):
            return round(((y.float() - ref).abs().max() / ref.abs().max()).item(), 5)

        def scaled_mm(a, w):
            q, s = quantize_tokens(a, gated)
            return torch._scaled_mm(q, w[0].t(), scale_a=s, scale_b=w[1].view(1, -1),
                                    out_dtype=a.dtype)

        t_new = time_graph(lambda a, w: run("w8a16", a, w, gated), wc, x)
        t_sm = time_graph(scaled_mm, wc, x)
        t_lin = time_graph(lambda a, w: fp8_linear(a, w[0], w[1], None, gated=gated), wc, x)
        t16 = time_graph(lambda a, w: F.linear(silu_and_mul(a) if gated else a, w), w16, x)
        rec = {"layer": layer, "n": n, "k": k, "gated": gated, "m": m,
               "config": dataclasses.asdict(pick_config(m, n, k, gated)),
               "floor_us": round(n * k / peak * 1e6, 2),
               "w8a16_us": round(t_new * 1e6, 2), "w8a16_tb_s": round(n * k / t_new / 1e12, 3),
               "w8a16_rel_err": err(fp8_w8a16_gemm(x, *wc[0], None, gated=gated)),
               "scaled_mm_us": round(t_sm * 1e6, 2),
               "scaled_mm_tb_s": round(n * k / t_sm / 1e12, 3),
               "scaled_mm_rel_err": err(scaled_mm(x, wc[0])),
               "fp8_linear_us": round(t_lin * 1e6, 2),
               "bf16_us": round(t16 * 1e6, 2), "bf16_tb_s": round(2 * n * k / t16 / 1e12, 3),
               "speedup_vs_scaled_mm": round(t_sm / t_new, 3),
               "speedup_vs_bf16": round(t16 / t_new, 3)}
        if m >= W8A8_TOKENS:
            t_a8 = time_graph(lambda a, w: run("w8a8", a, w, gated), wc, x)
            rec.update(w8a8_us=round(t_a8 * 1e6, 2), w8a8_tb_s=round(n * k / t_a8 / 1e12, 3),
                       w8a8_rel_err=err(run("w8a8", x, wc[0], gated)),
                       w8a8_config=dataclasses.asdict(pick_config(m, n, k, x_bytes=1)))
        if kind and m in SWEEP_TOKENS[kind]:
            times = {}
            for cfg in sweep[(layer, m)]:
                times[cfg] = time_graph(lambda a, w, c=cfg: run(kind, a, w, gated, c), wc, x)
            best = min(times, key=times.get)
            rec.update(best_kind=kind, best_config=dataclasses.asdict(best),
                       best_us=round(times[best] * 1e6, 2),
                       best_tb_s=round(n * k / times[best] / 1e12, 3),
                       best_rel_err=err(run(kind, x, wc[0], gated, best)),
                       sweep_us={str(tuple(dataclasses.astuple(c))): round(t * 1e6, 2)
                                 for c, t in sorted(times.items(), key=lambda ct: ct[1])})
        records.append(rec)
        print(json.dumps({key: v for key, v in rec.items() if key != "sweep_us"}), flush=True)
    del wc, w16, wd
    torch.cuda.empty_cache()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", choices=list(SWEEP_TOKENS),
                        help=f"also time a config grid of one kernel form at M in {SWEEP_TOKENS}")
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    args = parser.parse_args()
    gpu, peak = gpu_name(), copy_bandwidth()
    print(f"copy bandwidth: {peak / 1e12:.2f} TB/s", flush=True)
    sweep = {}
    if args.sweep:
        cases = [(layer, args.sweep, m, n, k, gated, cfg) for layer, (n, k, gated) in LAYERS.items()
                 for m in SWEEP_TOKENS[args.sweep]
                 for cfg in sweep_configs(args.sweep, m, n, k, gated)]
        ok = precompile(cases)
        for layer, *case in cases:
            if ok[compile_key(*case)]:
                sweep.setdefault((layer, case[1]), []).append(case[-1])
        print(f"sweep: {sum(ok.values())} of {len(ok)} variants compiled", flush=True)
    records = []
    for layer, (n, k, gated) in LAYERS.items():
        records += bench_layer(layer, n, k, gated, peak, sweep, args.sweep)
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{datetime.date.today().isoformat()}_fp8_small_{gpu}")
    with open(stem + ".json", "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "copy_tb_s": round(peak / 1e12, 3),
                   "records": records}, f, indent=1)
    title = (f"Batched decode through Qwen3-8B's FP8 layers (per-channel e4m3 weights, bf16 x), "
             f"{torch.cuda.get_device_name()}, copy bandwidth {peak / 1e12:.2f} TB/s; CUDA-graph "
             "replays over L2-cold weights. TB/s over the weight bytes; floor: e4m3 weight / copy "
             "bandwidth.")
    head = ("| layer | M | N x K | floor us | W8A16 us | TB/s | rel err | quant + W8A8 us | TB/s | "
            "rel err | quant + _scaled_mm us | TB/s | rel err | fp8_linear us | cuBLAS bf16 us | "
            "TB/s | W8A16 vs _scaled_mm | W8A16 vs bf16 | best swept (bm, bn, bk, split, warps, "
            "stages): us |")
    lines = [title, "", head, "|---" * 19 + "|"]
    for r in records:
        best = (f"{r['best_kind']} {tuple(r['best_config'].values())}: {r['best_us']}"
                if "best_config" in r else "")
        lines.append(f"| {r['layer']} | {r['m']} | {r['n']} x {r['k']} | {r['floor_us']} | "
                     f"{r['w8a16_us']} | {r['w8a16_tb_s']} | {r['w8a16_rel_err']} | "
                     f"{r.get('w8a8_us', '')} | {r.get('w8a8_tb_s', '')} | "
                     f"{r.get('w8a8_rel_err', '')} | "
                     f"{r['scaled_mm_us']} | {r['scaled_mm_tb_s']} | {r['scaled_mm_rel_err']} | "
                     f"{r['fp8_linear_us']} | {r['bf16_us']} | {r['bf16_tb_s']} | "
                     f"{r['speedup_vs_scaled_mm']} | {r['speedup_vs_bf16']} | {best} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
