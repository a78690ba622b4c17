"""What the GPU does between two batch-1 decode graphs (Qwen3-8B, FP8 weights): a torch profiler
trace of 24 engine steps; prints, for a few steps, every GPU op from the graph's last kernel (the
greedy sampler's) to the next graph's first, with start offsets and the gaps between them."""
import random
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import minisgl  # noqa: F401  (from PYTHONPATH)
from minisgl import LLM, SamplingParams

sys.path.insert(0, "benchmark/offline")
from bench_common import model_dir  # noqa: E402

path, dummy = model_dir("benchmark/configs/qwen3-8b.json")
llm = LLM(path, dummy_weights=dummy, quantization="fp8")
prompt = [random.Random(1).randint(0, 10000) for _ in range(128)]
params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
llm.generate([prompt], params, use_tqdm=False)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    llm.generate([prompt], params, use_tqdm=False)
events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                key=lambda e: e.time_range.start)
ops = [(e.time_range.start, e.time_range.end, e.name) for e in events]
ends = [i for i, (_, _, n) in enumerate(ops) if "_final_kernel" in n]
for a, b in zip(ends[8:12], ends[9:13]):
    # from this graph's sampler to the next graph's first layer GEMV
    j = next(k for k in range(a + 1, b) if "gemv" in ops[k][2])
    print(f"--- step: {ops[j][0] - ops[a][1]:.1f} us from sampler end to the next first GEMV")
    prev_end = ops[a][1]
    for s, e, n in ops[a + 1 : j + 1]:
        print(f"  gap {s - prev_end:6.1f}  dur {e - s:6.1f}  {n[:90]}")
        prev_end = e
llm.close()
