"""ncu probe (session 11): the W8A8 GEMM at 128 tokens (down, gate-up) and the FP8 GEMVs of the
small layers (qkv with the fused norm, o with the residual). Run from the repository root:
/usr/local/cuda/bin/ncu --kernel-name regex:"_w8a16_kernel|_fp8_gemv_kernel" --launch-count 8 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats python3 THIS_FILE"""
import sys

import torch

sys.path.insert(0, "python")
from minisgl.kernel.triton.fp8_gemv import fp8_gemv  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm  # noqa: E402
from minisgl.quant.fp8 import quantize_channel  # noqa: E402


def layer(n, k):
    return quantize_channel(torch.randn(n, k, device="cuda") * 0.02)


for n, k in ((4096, 12288), (24576, 4096)):
    wq, ws = layer(n, k)
    xq, xs = quantize_tokens(torch.randn(128, k, device="cuda", dtype=torch.bfloat16), False)
    for _ in range(2):
        fp8_w8a8_gemm(xq, xs, wq, ws)
x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
for n, fused in ((6144, True), (4096, False)):
    wq, ws = layer(n, 4096)
    res = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        fp8_gemv(x, wq, ws, None, norm_eps=1e-6 if fused else None,
                 residual=None if fused else res)
torch.cuda.synchronize()
