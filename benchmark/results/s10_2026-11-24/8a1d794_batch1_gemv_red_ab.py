"""A/B of the per-16-byte accumulators in one process: module constants patched between runs."""
import os, sys
sys.path[:0] = ["python", "benchmark/offline"]
from bench import run_batch1
from bench_common import model_dir
from minisgl.kernel.triton import fp8_gemv, gemv
path, dummy = model_dir("benchmark/configs/qwen3-8b.json")
pick8, pick16 = fp8_gemv.pick_config, gemv.pick_config
old8 = lambda n, k: (4, 1024, 4) if k >= 1024 else pick8(n, k)
runs = [("fp8 new", {"quantization": "fp8"}, 16, pick8, 8), ("fp8 old", {"quantization": "fp8"}, 1, old8, 1),
        ("bf16 red8", {}, 16, pick8, 8), ("bf16 red1", {}, 16, pick8, 1),
        ("fp8 new", {"quantization": "fp8"}, 16, pick8, 8), ("fp8 old", {"quantization": "fp8"}, 1, old8, 1),
        ("bf16 red8", {}, 16, pick8, 8), ("bf16 red1", {}, 16, pick8, 1)]
for name, opts, red8, pick, red16 in runs:
    fp8_gemv.RED, fp8_gemv.pick_config, gemv.RED = red8, pick, red16
    r = run_batch1(path, dummy, opts)
    print("B1", name, f"{r['ms_per_token']:.3f} ms", flush=True)
