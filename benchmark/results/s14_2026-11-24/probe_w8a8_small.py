"""Probe (session 14): the W8A8 GEMM at 2-64 tokens, where a decode batch of 2-63 requests runs
it: ``_w8a8_config``'s tiles (no split-K) against split-K 2/4/8 and deeper pipelines, next to the
one-token FP8 GEMV over the same weights (what streaming them reaches). Qwen3-8B's layers, the
GEMM alone on pre-quantized x, CUDA graphs over L2-cold weights."""
import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))

from bench_gemv import L2_FLUSH_BYTES, time_graph  # noqa: E402
from minisgl.kernel.triton.fp8_gemv import fp8_gemv  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16 import W8A16Config, fp8_w8a8_gemm, pick_config  # noqa: E402
from minisgl.quant.fp8 import quantize_channel  # noqa: E402

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
res = []
for name, (n, k) in LAYERS.items():
    copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
    ws = [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
          for _ in range(copies)]
    x1 = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    gemv = time_graph(lambda a, w: fp8_gemv(a, w[0], w[1], None), ws, x1) * 1e6
    print(name, "gemv m=1", round(gemv, 2), f"{n * k / gemv / 1e6:.2f} TB/s", flush=True)
    for m in (2, 8, 16, 32, 48, 64, 96):
        xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        ref = fp8_w8a8_gemm(xq, xs, *ws[0]).float()
        base = pick_config(m, n, k, x_bytes=1)
        rec = dict(layer=name, m=m, gemv_m1_us=round(gemv, 2),
                   default=str(base), default_us=round(time_graph(
                       lambda a, w: fp8_w8a8_gemm(a[0], a[1], *w), ws, (xq, xs)) * 1e6, 2))
        cands = []
        for split in (2, 4, 8):
            cands.append(W8A16Config(base.block_m, base.block_n, base.block_k, split,
                                     base.num_warps, base.num_stages))
            cands.append(W8A16Config(base.block_m, base.block_n, 128, split, 4, 4))
        cands += [W8A16Config(base.block_m, 64, 128, 1, 4, 6),
                  W8A16Config(base.block_m, 128, 128, 1, 8, 4),
                  W8A16Config(16, 64, 256, 1, 4, 5), W8A16Config(16, 64, 256, 2, 4, 5)]
        for cfg in cands:
            key = str((cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps,
                       cfg.num_stages))
            if key in rec:
                continue
            try:
                out = fp8_w8a8_gemm(xq, xs, *ws[0], config=cfg).float()
                assert (out - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
                t = time_graph(lambda a, w, c=cfg: fp8_w8a8_gemm(a[0], a[1], *w, config=c),
                               ws, (xq, xs))
            except Exception as e:  # noqa: BLE001
                rec[key] = type(e).__name__
                continue
            rec[key] = round(t * 1e6, 2)
        best = min((v, kk) for kk, v in rec.items() if kk.startswith("(") and isinstance(v, float))
        rec["best"] = best
        res.append(rec)
        print(name, m, "default", rec["default_us"], "best", best, flush=True)
    del ws
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "probe_w8a8_small.json"), "w") as f:
    json.dump(res, f, indent=1)
