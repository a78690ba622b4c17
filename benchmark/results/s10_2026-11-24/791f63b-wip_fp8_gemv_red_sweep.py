import os, sys, json, itertools, torch
sys.path[:0] = ["python", "benchmark/kernels", "benchmark/offline"]
from bench_fp8 import channel_weights, copy_bandwidth
from bench_gemv import L2_FLUSH_BYTES, time_graph
from minisgl.kernel.triton.fp8_gemv import fp8_gemv
peak = copy_bandwidth()
LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
res = {}
for name, (n, k) in LAYERS.items():
    wc = channel_weights(n, k, max(2, min(64, L2_FLUSH_BYTES // (n * k))))
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    for red, bk, warps in itertools.product((1, 16), (1024, 2048, 4096), (4, 8)):
        os.environ["MINISGL_GEMV_RED"] = str(red)
        try:
            t = time_graph(lambda a, w: fp8_gemv(a, w[0], w[1], None, config=(4, bk, warps)), wc, x)
        except Exception as e:
            print(name, red, bk, warps, "failed", str(e)[:100]); continue
        res[(name, red, bk, warps)] = t * 1e6
        print(name, red, bk, warps, f"{t*1e6:.2f} us", f"{n*k/t/1e12:.3f} TB/s", flush=True)
    del wc
for name in LAYERS:
    best1 = min((v, kk) for kk, v in res.items() if kk[0] == name and kk[1] == 1)
    best16 = min((v, kk) for kk, v in res.items() if kk[0] == name and kk[1] == 16)
    print("BEST", name, "red1", best1, "red16", best16, "default(4,1024,4) red16", res.get((name, 16, 1024, 4)))
