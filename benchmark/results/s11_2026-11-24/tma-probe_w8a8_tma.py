"""Session 11 probe: the TMA W8A8 GEMM against the cp.async W8A8 form, a few configs per layer."""
import sys, time
import torch
sys.path.insert(0, "python"); sys.path.insert(0, "benchmark/kernels"); sys.path.insert(0, "benchmark/offline")
from bench_fp8 import channel_weights
from bench_gemv import time_graph
from minisgl.kernel.triton.fp8_quant import quantize_tokens
from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm
from minisgl.kernel.triton.fp8_w8a8 import TmaConfig, fp8_w8a8_tma_gemm
from minisgl.quant.fp8 import channel_gemm_reference
LAYERS = {"down": (4096, 12288, True), "gate_up": (24576, 4096, False), "o": (4096, 4096, False)}
t0 = time.time()
for layer, (n, k, gated) in LAYERS.items():
    wc = channel_weights(n, k, max(2, min(64, 400_000_000 // (n * k))))
    for m in (64, 128, 256):
        x = torch.randn(m, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
        bm = min(128, max(16, 1 << (m - 1).bit_length()))
        def old(a, w):
            q, s = quantize_tokens(a, gated); return fp8_w8a8_gemm(q, s, w[0], w[1], out_dtype=a.dtype)
        res = {"w8a8": time_graph(old, wc, x)}
        cfgs = {"WA": TmaConfig(bm, 64, 256, 4, 4, True), "WB": TmaConfig(bm, 64, 128, 4, 4, True),
                "WC": TmaConfig(bm, 128, 128, 8, 4, True), "WE": TmaConfig(bm, 128, 256, 8, 3, True)}
        for name, cfg in cfgs.items():
            def new(a, w, cfg=cfg):
                q, s = quantize_tokens(a, gated); return fp8_w8a8_tma_gemm(q, s, w[0], w[1], out_dtype=a.dtype, config=cfg)
            try:
                print("compiling", name, flush=True) if m == 64 and layer == "down" else None
                res[name] = time_graph(new, wc, x)
            except Exception as e:
                res[name] = float("nan"); print("ERR", name, str(e)[-300:])
        q, s = quantize_tokens(x, gated)
        ref = channel_gemm_reference(q, s, *wc[0])
        y = fp8_w8a8_tma_gemm(q, s, *wc[0], out_dtype=torch.float32, config=cfgs["WA"])
        err = ((y - ref).abs().max() / ref.abs().max()).item()
        print(f"{time.time()-t0:5.0f}s {layer} m={m} " + " ".join(f"{k_}={v*1e6:.1f}" for k_, v in res.items()) + f" errA={err:.4f}", flush=True)
    del wc; torch.cuda.empty_cache()
