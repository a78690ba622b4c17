"""Probe (session 16): the W8A8 GEMM on Qwen3-8B's layers at 64 / 128 / 256 tokens, each launched
once after a warm-up, for Nsight Compute (``ncu -k regex:_w8a16``) to say what bounds it.

    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        -k regex:_w8a16 python probe_ncu_w8a8.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm  # noqa: E402
from minisgl.quant.fp8 import quantize_channel  # noqa: E402

LAYERS = {"o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288), "qkv": (6144, 4096)}
for name, (n, k) in LAYERS.items():
    w = quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
    for m in (64, 128, 256):
        xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        fp8_w8a8_gemm(xq, xs, *w)  # compile (ncu: -k regex plus --launch-skip by the caller)
        torch.cuda.synchronize()
        print(name, m, flush=True)
