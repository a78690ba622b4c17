"""Probe (session 13): Qwen3-8B's gate-up at 2-256 tokens, the W8A8 GEMM then the down input's
quantization with SiLU-and-mul (``quantize_tokens(y, gated=True)``, today) against the GEMM with
SiLU-and-mul in its epilogue (``act=True``: writes half the bytes) then the plain quantization of
half the bytes. CUDA graphs over L2-cold weight copies."""
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
from minisgl.kernel.triton.fp8_w8a16 import W8A16Config, fp8_w8a8_gemm  # noqa: E402
from minisgl.quant.fp8 import quantize_channel  # noqa: E402

n, k = 24576, 4096
copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
ws = [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
      for _ in range(copies)]
res = []
for m in (2, 16, 64, 128, 192, 256):
    xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    t_gemm = time_graph(lambda a, w: fp8_w8a8_gemm(a[0], a[1], *w), ws, (xq, xs))
    t_old = time_graph(lambda a, w: quantize_tokens(fp8_w8a8_gemm(a[0], a[1], *w), True),
                       ws, (xq, xs))
    base = fp8_w8a16._w8a8_act_config(m, n // 2, fp8_w8a16.SMS)
    rec = dict(m=m, gemm_us=round(t_gemm * 1e6, 2), old_us=round(t_old * 1e6, 2),
               act_default=str(base))
    bm = base.block_m
    cfgs = {base, W8A16Config(bm, 64, 128, 1, 4, 3), W8A16Config(bm, 64, 128, 1, 8, 3),
            W8A16Config(bm, 64, 128, 1, 4, 4), W8A16Config(bm, 64, 256, 1, 4, 3),
            W8A16Config(bm, 64, 128, 1, 8, 4), W8A16Config(max(16, bm // 2), 64, 128, 1, 4, 4)}
    for cfg in cfgs:
        try:
            t_act = time_graph(lambda a, w, c=cfg: fp8_w8a8_gemm(a[0], a[1], *w, config=c,
                                                                 act=True), ws, (xq, xs))
            t_new = time_graph(lambda a, w, c=cfg: quantize_tokens(
                fp8_w8a8_gemm(a[0], a[1], *w, config=c, act=True)), ws, (xq, xs))
        except Exception as e:  # noqa: BLE001
            print(m, cfg, "failed", type(e).__name__, str(e)[:200], flush=True)
            continue
        key = str((cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages))
        rec[key] = dict(act_us=round(t_act * 1e6, 2), act_quant_us=round(t_new * 1e6, 2))
    res.append(rec)
    print(json.dumps(rec), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "probe_gate_up_act.json"), "w") as f:
    json.dump(res, f, indent=1)
