"""Probe (session 16): the W8A8 GEMM at 64-256 tokens (batched decode) with larger tiles over
split K, which read x from L2 fewer times (L2 traffic = M N K (1/BLOCK_N + 1/BLOCK_M) bytes).
The GEMM alone (``gemm``: what a consumer that sums the fp32 partials itself would see) and
with today's ``_sum_splits_kernel`` (``+sum``). Qwen3-8B's layers, CUDA graphs over L2-cold
weights, H100.

    python probe_splitk.py OUT.json
"""
import json
import os
import sys

import torch
import triton

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))

from bench_gemv import L2_FLUSH_BYTES, time_graph  # noqa: E402
from minisgl.kernel.triton import fp8_w8a16 as mod  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.quant.fp8 import quantize_channel  # noqa: E402

C = mod.W8A16Config
LAYERS = {"o": (4096, 4096), "down": (4096, 12288), "qkv": (6144, 4096), "gate_up": (24576, 4096)}


def gemm_only(xq, xs, w, ws, cfg, out):
    m, k = xq.shape
    n = w.shape[0]
    steps = triton.cdiv(k, cfg.block_k)
    per = triton.cdiv(steps, cfg.split_k)
    splits = triton.cdiv(steps, per)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), splits)
    mod._w8a16_kernel[grid](
        xq, xs, w, ws, w, out, m, n, k, per, xq.stride(0), w.stride(0), ws.stride(0),
        CHANNEL=True, SCALE_BN=1, SCALE_BK=1, GATED=False, A8=True, HAS_BIAS=False,
        EVEN_M=m % cfg.block_m == 0, EVEN_K=k % cfg.block_k == 0, SPLIT=splits > 1,
        DOT_PREC="tf32", BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, USE_PDL=False)
    return out


def candidates(name, m):
    bm = min(128, max(16, triton.next_power_of_2(m)))
    if name in ("o", "down"):
        return [C(bm, 64, 256, 2, 4, 4), C(bm, 64, 128, 2, 4, 5), C(bm, 128, 128, 2, 8, 4),
                C(bm, 128, 128, 4, 8, 4), C(bm, 128, 256, 2, 8, 3), C(64, 64, 256, 2, 4, 4),
                C(256, 64, 128, 2, 8, 3), C(256, 128, 64, 2, 8, 3), C(256, 64, 128, 4, 8, 3)]
    return [C(256, 64, 128, 1, 8, 3), C(256, 128, 64, 1, 8, 3), C(256, 128, 128, 1, 8, 3),
            C(bm, 128, 128, 2, 8, 4), C(bm, 256, 64, 1, 8, 3), C(bm, 256, 128, 2, 8, 3)]


res = []
for name, (n, k) in LAYERS.items():
    copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
    ws = [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
          for _ in range(copies)]
    for m in (64, 96, 128, 160, 192, 224, 256):
        xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        ref = mod.fp8_w8a8_gemm(xq, xs, *ws[0]).float()
        base = mod.pick_config(m, n, k, x_bytes=1)
        rec = dict(layer=name, m=m, default=str(base), default_us=round(time_graph(
            lambda a, w: mod.fp8_w8a8_gemm(a[0], a[1], *w), ws, (xq, xs)) * 1e6, 2))
        for cfg in candidates(name, m):
            key = str((cfg.block_m, cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps,
                       cfg.num_stages))
            try:
                out = mod.fp8_w8a8_gemm(xq, xs, *ws[0], config=cfg).float()
                assert (out - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
                rec[key + "+sum"] = round(time_graph(
                    lambda a, w, c=cfg: mod.fp8_w8a8_gemm(a[0], a[1], *w, config=c),
                    ws, (xq, xs)) * 1e6, 2)
                if cfg.split_k > 1:
                    part = torch.empty(cfg.split_k, m, n, device="cuda")
                    rec[key] = round(time_graph(
                        lambda a, w, c=cfg: gemm_only(a[0], a[1], w[0], w[1], c, part),
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
