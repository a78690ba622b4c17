"""Probe (session 16): Nsight Compute puts the W8A8 GEMM of the smaller layers (o, down, qkv) at
42-65% of DRAM bandwidth with one 4-warp program per SM. The same tiles with 8 warps, and
smaller token tiles with fewer stages (two programs per SM), at 64-160 tokens. Qwen3-8B's
layers, CUDA graphs over L2-cold weights, H100.

    python probe_w8a8_warps.py OUT.json
"""
import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))

from bench_gemv import L2_FLUSH_BYTES, time_graph  # noqa: E402
from minisgl.kernel.triton import fp8_w8a16 as mod  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.quant.fp8 import quantize_channel  # noqa: E402

C = mod.W8A16Config
LAYERS = {"o": (4096, 4096), "down": (4096, 12288), "qkv": (6144, 4096), "gate_up": (24576, 4096)}

res = []
for name, (n, k) in LAYERS.items():
    copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
    ws = [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
          for _ in range(copies)]
    for m in (64, 96, 128, 160):
        xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        ref = mod.fp8_w8a8_gemm(xq, xs, *ws[0]).float()
        base = mod.pick_config(m, n, k, x_bytes=1)
        rec = dict(layer=name, m=m, default=str(base), default_us=round(time_graph(
            lambda a, w: mod.fp8_w8a8_gemm(a[0], a[1], *w), ws, (xq, xs)) * 1e6, 2))
        cands = {C(base.block_m, base.block_n, base.block_k, 1, 8, base.num_stages),
                 C(base.block_m, base.block_n, base.block_k, 1, 8, base.num_stages - 1),
                 C(base.block_m, base.block_n, base.block_k, 1, 4, base.num_stages - 1),
                 C(max(16, base.block_m // 2), base.block_n, base.block_k, 1, 4, 3),
                 C(max(16, base.block_m // 2), base.block_n, base.block_k, 1, 8, 3),
                 C(max(16, base.block_m // 2), base.block_n, 128, 1, 4, 4)}
        for cfg in sorted(cands, key=str):
            key = str((cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps,
                       cfg.num_stages))
            try:
                out = mod.fp8_w8a8_gemm(xq, xs, *ws[0], config=cfg).float()
                assert (out - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
                rec[key] = round(time_graph(
                    lambda a, w, c=cfg: mod.fp8_w8a8_gemm(a[0], a[1], *w, config=c),
                    ws, (xq, xs)) * 1e6, 2)
            except Exception as e:  # noqa: BLE001
                rec[key] = f"{type(e).__name__}: {str(e)[:80]}"
        times = [(v, kk) for kk, v in rec.items() if kk.startswith("(") and isinstance(v, float)]
        rec["best"] = min(times) if times else None
        res.append(rec)
        print(name, m, "default", rec["default"], rec["default_us"], "best", rec["best"],
              flush=True)
    del ws
    torch.cuda.empty_cache()
json.dump({"device": torch.cuda.get_device_name(), "rows": res}, open(sys.argv[1], "w"), indent=1)
