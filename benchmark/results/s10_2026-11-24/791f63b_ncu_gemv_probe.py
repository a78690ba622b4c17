import sys, torch
sys.path.insert(0, "python")
from minisgl.kernel.triton.fp8_gemv import fp8_gemv
from minisgl.kernel.triton.gemv import gemv
from minisgl.quant.fp8 import quantize_channel
n, k = (6144, 4096) if len(sys.argv) < 2 else map(int, sys.argv[1].split("x"))
w = torch.randn(n, k, device="cuda") * 0.02
wq, ws = quantize_channel(w)
wb = w.to(torch.bfloat16)
x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    fp8_gemv(x, wq, ws, None)
    gemv(x, wb)
torch.cuda.synchronize()
