"""Probe (session 13): what the FP8 GEMMs' fp32 promotion costs and buys. ``torch._scaled_mm``
(row-wise scales, the path of more than 256 tokens) with and without ``use_fast_accum``, and the
W8A8 Triton GEMM's down projection (K = 12,288) with and without its per-K-step fp32 promotion
(``FAST_ACCUM_MAX_K``): time (CUDA graphs, L2-cold weights) and the largest error against fp32
over the same quantized operands, relative to the largest output."""
import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "offline"))

from bench_gemv import L2_FLUSH_BYTES, time_graph  # noqa: E402
from minisgl.kernel.triton import fp8_w8a16  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.quant.fp8 import channel_gemm_reference, quantize_channel  # noqa: E402

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


def rel(y, ref):
    return round(((y.float() - ref).abs().max() / ref.abs().max()).item(), 5)


res = []
for name, (n, k) in LAYERS.items():
    copies = max(2, min(16, L2_FLUSH_BYTES // (n * k)))
    ws = [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
          for _ in range(copies)]
    for m in (64, 128, 192, 256, 2048, 8192):
        xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        ref = channel_gemm_reference(xq, xs, *ws[0]).float()
        rec = dict(layer=name, m=m)
        if m > 256:
            for fast in (False, True):
                def mm(a, w, fast=fast):
                    return torch._scaled_mm(a[0], w[0].t(), scale_a=a[1], scale_b=w[1].view(1, -1),
                                            out_dtype=torch.bfloat16, use_fast_accum=fast)
                t = time_graph(mm, ws, (xq, xs), calls=16)
                rec[f"scaled_mm_fast{int(fast)}"] = (round(t * 1e6, 1), rel(mm((xq, xs), ws[0]), ref),
                                                     round(2 * m * n * k / t / 1e12))
        elif name == "down":
            for fast in (False, True):
                fp8_w8a16.FAST_ACCUM_MAX_K = 1 << 30 if fast else 4096
                f = lambda a, w: fp8_w8a16.fp8_w8a8_gemm(a[0], a[1], *w)  # noqa: E731
                t = time_graph(f, ws, (xq, xs))
                rec[f"w8a8_fast{int(fast)}"] = (round(t * 1e6, 2), rel(f((xq, xs), ws[0]), ref))
            fp8_w8a16.FAST_ACCUM_MAX_K = 4096
        if len(rec) > 2:
            res.append(rec)
            print(json.dumps(rec), flush=True)
    del ws
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "probe_fast_accum.json"), "w") as f:
    json.dump(res, f, indent=1)
