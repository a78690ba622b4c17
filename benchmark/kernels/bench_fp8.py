"""FP8 linear kernels against ``torch._scaled_mm`` and the bf16 kernels, on Qwen3-8B's layers.

    python benchmark/kernels/bench_fp8.py [--sweep] [--out DIR]

* GEMV (one token): the FP8 GEMV (``kernel/triton/fp8_gemv.py``, e4m3 weight, 128x128 block scales)
  vs the bf16 Triton GEMV and cuBLAS bf16. TB/s counts the bytes each kernel must read (weight,
  scales, x); ``peak_fraction`` divides by the HBM bandwidth a large device-to-device copy reaches
  on this GPU (the bandwidth its bytes allow); the target is >= 0.8.
* GEMM (M tokens): activation quantization + the block-scaled GEMM (``fp8_gemm.py``) vs
  ``torch._scaled_mm`` with row-wise scales (per token x per output channel: the per-channel
  alternative for ``--quantization fp8``) and vs cuBLAS bf16, in TFLOP/s. ``rel_err`` is the block
  GEMM's max error against ``block_gemm_reference`` (fp32 over the same quantized operands) over the
  largest reference magnitude; the target is <= 1e-2.
* Per-channel (``--quantization fp8``'s default; ``--quantization fp8-block`` is the block columns):
  ``quant.fp8_dispatch.fp8_linear`` end to end with per-output-channel weight scales: the
  per-channel FP8 GEMV at one token; per-token activation quantization (``fp8_quant.py``) +
  ``torch._scaled_mm`` beyond (``channel_us``, ``channel_rel_err`` against
  ``channel_gemm_reference``).
Every case is timed as decode runs it: a CUDA graph replays many calls over enough weight copies
that none stays in L2. ``--sweep`` times a grid of configurations per case (for ``pick_config``).
Writes ``<date>_fp8_<gpu>.{json,md}``.
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
sys.path.insert(0, os.path.dirname(__file__))

from bench_common import gpu_name  # noqa: E402
from bench_gemv import L2_FLUSH_BYTES, SHAPES, time_graph  # noqa: E402

from minisgl.kernel.triton.fp8_gemm import GemmConfig, fp8_block_gemm, pick_config, quantize_act  # noqa: E402
from minisgl.kernel.triton.fp8_gemv import fp8_gemv  # noqa: E402
from minisgl.kernel.triton.fp8_gemv import pick_config as gemv_config
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.gemv import gemv  # noqa: E402
from minisgl.quant.fp8 import (  # noqa: E402
    block_gemm_reference,
    channel_gemm_reference,
    dequantize_channel,
    quantize_block,
    quantize_channel,
)
from minisgl.quant.fp8_dispatch import fp8_linear  # noqa: E402

BLOCK = (128, 128)
TOKENS = [1, 16, 64, 256, 1024, 4096]
GEMV_SWEEP = list(itertools.product([2, 4, 8, 16], [1024, 2048, 4096], [4, 8, 16]))
GEMM_SWEEP = [GemmConfig(m, n, g, w, s) for m, n, g, w, s in itertools.product(
    [16, 32, 64, 128], [64, 128], [1, 8], [4, 8], [3, 4])]


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write): what HBM delivers in practice."""
    a = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    t = time_graph(lambda x, y: y.copy_(x), [b], a, calls=8)
    return 2 * a.numel() * a.element_size() / t


def fp8_weights(n: int, k: int, copies: int):
    ws = []
    for _ in range(copies):
        q, s = quantize_block(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02, BLOCK)
        ws.append((q, s))
    return ws


def channel_weights(n: int, k: int, copies: int):
    return [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
            for _ in range(copies)]


def bench_gemv(n: int, k: int, peak: float, sweep: bool) -> dict:
    nbytes = n * k + (n // 128) * (k // 128) * 4 + 2 * k
    copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
    ws8 = fp8_weights(n, k, copies)
    w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
           for _ in range(max(2, copies // 2))]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    t8 = time_graph(lambda a, w: fp8_gemv(a, w[0], w[1], BLOCK), ws8, x)
    wc = channel_weights(n, k, copies)
    t_ch = time_graph(lambda a, w: fp8_linear(a, w[0], w[1], None), wc, x)
    ref_ch = x.float() @ dequantize_channel(*wc[0]).T
    err_ch = (fp8_linear(x, *wc[0], None).float() - ref_ch).abs().max() / ref_ch.abs().max()
    del wc
    t16 = time_graph(gemv, w16, x)
    tcublas = time_graph(F.linear, w16, x)
    ref = x.float() @ (ws8[0][0].float() * ws8[0][1].repeat_interleave(128, 0)
                       .repeat_interleave(128, 1)[:n, :k]).T
    err = (fp8_gemv(x, *ws8[0], BLOCK).float() - ref).abs().max().item() / ref.abs().max().item()
    rec = {"kernel": "gemv", "n": n, "k": k, "config": list(gemv_config(n, k)),
           "rel_err": round(err, 5),
           "fp8_us": round(t8 * 1e6, 2), "bf16_triton_us": round(t16 * 1e6, 2),
           "bf16_cublas_us": round(tcublas * 1e6, 2), "fp8_tb_s": round(nbytes / t8 / 1e12, 3),
           "peak_fraction": round(nbytes / t8 / peak, 3), "speedup_vs_bf16": round(t16 / t8, 3),
           "channel_us": round(t_ch * 1e6, 2), "channel_speedup_vs_bf16": round(t16 / t_ch, 3),
           "channel_rel_err": round(err_ch.item(), 5)}
    if sweep:  # the per-channel GEMV (what --quantization fp8 runs) over block sizes
        wc = channel_weights(n, k, copies)
        times = {}
        for c in GEMV_SWEEP:
            if c[0] * c[1] // (32 * c[2]) > 256:
                continue  # accumulator registers per thread above 256
            times[c] = time_graph(lambda a, w, c=c: fp8_gemv(a, w[0], w[1], None, config=c), wc, x)
        best = min(times, key=times.get)
        rec["sweep_us"] = {str(list(c)): round(t * 1e6, 2) for c, t in times.items()}
        rec["best_config"], rec["best_peak_fraction"] = (
            list(best), round(nbytes / times[best] / peak, 3))
        rec["best_tb_s"] = round(n * k / times[best] / 1e12, 3)
        del wc
    return rec


def bench_gemm(m: int, n: int, k: int, sweep: bool) -> dict:
    copies = max(2, min(16, L2_FLUSH_BYTES // (n * k)))
    ws8 = fp8_weights(n, k, copies)
    w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
           for _ in range(max(2, copies // 2))]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq, xs = quantize_act(x, 128)
    ref = block_gemm_reference(xq, xs, *ws8[0], BLOCK)
    out = fp8_block_gemm(xq, xs, *ws8[0], BLOCK, torch.float32)
    err = (out - ref).abs().max().item() / ref.abs().max().item()
    flops = 2 * m * n * k

    def block_path(a, w, cfg=None):
        q, s = quantize_act(a, 128)
        return fp8_block_gemm(q, s, w[0], w[1], BLOCK, torch.bfloat16, cfg)

    t_block = time_graph(block_path, ws8, x)
    t_gemm_only = time_graph(
        lambda a, w: fp8_block_gemm(xq, xs, w[0], w[1], BLOCK, torch.bfloat16), ws8, x)
    t16 = time_graph(F.linear, w16, x)
    rec = {"kernel": "gemm", "m": m, "n": n, "k": k, "config": pick_config(m, n, k).__dict__,
           "rel_err": round(err, 6), "block_us": round(t_block * 1e6, 2),
           "block_gemm_only_us": round(t_gemm_only * 1e6, 2), "bf16_cublas_us": round(t16 * 1e6, 2),
           "block_tflops": round(flops / t_block / 1e12, 1),
           "bf16_tflops": round(flops / t16 / 1e12, 1),
           "speedup_vs_bf16": round(t16 / t_block, 3)}
    wc = channel_weights(n, k, copies)
    t_ch = time_graph(lambda a, w: fp8_linear(a, w[0], w[1], None), wc, x)
    cq, cs = quantize_tokens(x)
    ref_ch = channel_gemm_reference(cq, cs, *wc[0])
    err_ch = (fp8_linear(x, *wc[0], None).float() - ref_ch).abs().max() / ref_ch.abs().max()
    rec.update(channel_us=round(t_ch * 1e6, 2), channel_tflops=round(flops / t_ch / 1e12, 1),
               channel_speedup_vs_bf16=round(t16 / t_ch, 3),
               channel_rel_err=round(err_ch.item(), 6))
    del wc
    try:  # row-wise scaled cuBLAS FP8 (needs M, N, K multiples of 16)
        sa = torch.rand(m, 1, device="cuda") + 0.5
        wt = [(w[0], (torch.rand(1, n, device="cuda") + 0.5)) for w in ws8]
        t_sm = time_graph(lambda a, w: torch._scaled_mm(a, w[0].T, scale_a=sa, scale_b=w[1],
                                                        out_dtype=torch.bfloat16), wt, xq)
        rec["scaled_mm_rowwise_us"] = round(t_sm * 1e6, 2)
        rec["scaled_mm_rowwise_tflops"] = round(flops / t_sm / 1e12, 1)
    except RuntimeError as e:
        rec["scaled_mm_rowwise_error"] = str(e).splitlines()[0][:120]
    if sweep:
        times = {}
        for cfg in GEMM_SWEEP:
            try:
                times[cfg] = time_graph(lambda a, w, c=cfg: block_path(a, w, c), ws8, x)
            except Exception:  # noqa: BLE001  (a tile that does not fit in shared memory)
                continue
        best = min(times, key=times.get)
        rec["best_config"], rec["best_tflops"] = best.__dict__, round(flops / times[best] / 1e12, 1)
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--gemv-only", action="store_true", help="only the one-token GEMVs")
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    args = parser.parse_args()
    gpu, peak = gpu_name(), copy_bandwidth()
    print(f"copy bandwidth: {peak / 1e12:.2f} TB/s", flush=True)
    records = []
    for layer, (n, k) in SHAPES["qwen3-8b"].items():
        if layer == "lm_head":
            continue  # never quantized
        records.append({"layer": layer, **bench_gemv(n, k, peak, args.sweep)})
        print(json.dumps(records[-1]), flush=True)
        for m in [] if args.gemv_only else TOKENS[1:]:
            records.append({"layer": layer, **bench_gemm(m, n, k, args.sweep)})
            print(json.dumps(records[-1]), flush=True)
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{datetime.date.today().isoformat()}_fp8_{gpu}")
    with open(stem + ".json", "w") as f:
        json.dump({"copy_tb_s": round(peak / 1e12, 3), "records": records}, f, indent=1)
    lines = [f"FP8 kernels on Qwen3-8B's layers, {torch.cuda.get_device_name()}, copy bandwidth "
             f"{peak / 1e12:.2f} TB/s; CUDA-graph replays over L2-cold weights.", "",
             "| layer | N x K | FP8 GEMV us | TB/s | of copy bandwidth | bf16 Triton GEMV us | "
             "cuBLAS bf16 us | speed-up vs bf16 | rel err | per-channel GEMV us | speed-up | "
             "rel err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["kernel"] == "gemv":
            lines.append(f"| {r['layer']} | {r['n']} x {r['k']} | {r['fp8_us']} | "
                         f"{r['fp8_tb_s']} | "
                         f"{r['peak_fraction']} | {r['bf16_triton_us']} | {r['bf16_cublas_us']} | "
                         f"{r['speedup_vs_bf16']} | {r['rel_err']} | {r['channel_us']} | "
                         f"{r['channel_speedup_vs_bf16']} | {r['channel_rel_err']} |")
    lines += ["", "| layer | M | N x K | block FP8 (quant + GEMM) us | TFLOP/s | GEMM only us | "
              "_scaled_mm row-wise us | TFLOP/s | cuBLAS bf16 us | TFLOP/s | rel err | per-channel "
              "(quant + _scaled_mm) us | TFLOP/s | speed-up vs bf16 | rel err |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["kernel"] == "gemm":
            lines.append(f"| {r['layer']} | {r['m']} | {r['n']} x {r['k']} | {r['block_us']} | "
                         f"{r['block_tflops']} | {r['block_gemm_only_us']} | "
                         f"{r.get('scaled_mm_rowwise_us', '-')} | "
                         f"{r.get('scaled_mm_rowwise_tflops', '-')} | "
                         f"{r['bf16_cublas_us']} | {r['bf16_tflops']} | {r['rel_err']} | "
                         f"{r['channel_us']} | {r['channel_tflops']} | "
                         f"{r['channel_speedup_vs_bf16']} | "
                         f"{r['channel_rel_err']} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
