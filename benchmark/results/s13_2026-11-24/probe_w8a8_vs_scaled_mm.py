"""Probe (session 13): with fast accumulation, where ``torch._scaled_mm`` overtakes the W8A8 GEMM
on Qwen3-8B's layers at 64-256 tokens (x already quantized, as the norms do for QKV and
gate-up). CUDA graphs over L2-cold weights."""
import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "offline"))

from bench_gemv import L2_FLUSH_BYTES, time_graph  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm  # noqa: E402
from minisgl.quant.fp8 import quantize_channel  # noqa: E402

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
res = []
for name, (n, k) in LAYERS.items():
    copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
    ws = [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
          for _ in range(copies)]
    for m in (64, 96, 128, 160, 192, 224, 256):
        xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        t8 = time_graph(lambda a, w: fp8_w8a8_gemm(a[0], a[1], *w), ws, (xq, xs))
        tsm = time_graph(lambda a, w: torch._scaled_mm(a[0], w[0].t(), scale_a=a[1],
                                                       scale_b=w[1].view(1, -1),
                                                       out_dtype=torch.bfloat16,
                                                       use_fast_accum=True), ws, (xq, xs))
        res.append(dict(layer=name, m=m, w8a8_us=round(t8 * 1e6, 2),
                        scaled_mm_fast_us=round(tsm * 1e6, 2)))
        print(json.dumps(res[-1]), flush=True)
    del ws
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "probe_w8a8_vs_scaled_mm.json"), "w") as f:
    json.dump(res, f, indent=1)
