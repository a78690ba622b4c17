"""Probe (session 13): W8A8 tiles the earlier sweeps left out at 128-256 tokens: 128-row N tiles
with 8 warps (two warpgroups) over 32- and 64-token M tiles, against ``_w8a8_config``'s choice.
Qwen3-8B's four layers, the GEMM alone on pre-quantized x, CUDA graphs over L2-cold weights."""
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
from minisgl.kernel.triton.fp8_w8a16 import W8A16Config, fp8_w8a8_gemm, pick_config  # noqa: E402
from minisgl.quant.fp8 import quantize_channel  # noqa: E402

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
CFGS = [(64, 128, 128, 8, 3), (64, 128, 128, 8, 4), (64, 128, 256, 8, 3), (32, 128, 128, 8, 4),
        (32, 128, 256, 8, 3), (128, 128, 128, 8, 4), (64, 64, 256, 4, 4), (128, 64, 256, 4, 4),
        (64, 128, 128, 4, 4), (128, 128, 64, 8, 6)]
res = []
for name, (n, k) in LAYERS.items():
    copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
    ws = [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
          for _ in range(copies)]
    for m in (128, 192, 256):
        xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        base = pick_config(m, n, k, x_bytes=1)
        rec = dict(layer=name, m=m, default=str((base.block_m, base.block_n, base.block_k,
                                                 base.num_warps, base.num_stages)),
                   default_us=round(time_graph(lambda a, w: fp8_w8a8_gemm(a[0], a[1], *w),
                                               ws, (xq, xs)) * 1e6, 2))
        for bm, bn, bk, wp, st in CFGS:
            cfg = W8A16Config(bm, bn, bk, 1, wp, st)
            try:
                t = time_graph(lambda a, w, c=cfg: fp8_w8a8_gemm(a[0], a[1], *w, config=c),
                               ws, (xq, xs))
            except Exception as e:  # noqa: BLE001
                rec[str((bm, bn, bk, wp, st))] = type(e).__name__
                continue
            rec[str((bm, bn, bk, wp, st))] = round(t * 1e6, 2)
        best = min((v, kk) for kk, v in rec.items() if kk.startswith("(") and isinstance(v, float))
        rec["best"] = best
        res.append(rec)
        print(name, m, "default", rec["default"], rec["default_us"], "best", best, flush=True)
    del ws
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "probe_w8a8_wide.json"), "w") as f:
    json.dump(res, f, indent=1)
