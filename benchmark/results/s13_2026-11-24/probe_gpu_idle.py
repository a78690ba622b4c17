"""Probe (session 13): is the GPU idle between decode steps? 256 requests of 512 prompt tokens,
96 new tokens each; torch.profiler over the whole run; over the decode part (after the last
prefill kernel) the union of kernel intervals against the wall span, and the gaps."""
import os
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "offline"))

from bench import model_dir  # noqa: E402
from minisgl import LLM, SamplingParams  # noqa: E402

quant = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "none" else None
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 256
path, dummy = model_dir("benchmark/configs/qwen3-8b.json")
llm = LLM(path, dummy_weights=dummy, num_pages=200000, quantization=quant)
params = SamplingParams(max_tokens=96, ignore_eos=True, temperature=0)
prompts = [[(131 * i + 7 * j) % 30000 + 1 for j in range(512)] for i in range(batch)]
llm.generate([p[:64] for p in prompts[:8]], params, use_tqdm=False)
tic = time.perf_counter()
llm.generate(prompts, params, use_tqdm=False)
wall = time.perf_counter() - tic
prompts = [[t + 1 for t in p] for p in prompts]
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
llm.close()
kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                 if e.device_type == DeviceType.CUDA)
# decode: after the last kernel of a prefill-sized GEMM / the extend attention
last_prefill = max(s for s, _, n in kernels if "extend" in n)
dec = [(s, e) for s, e, _ in kernels if s > last_prefill]
busy, gaps, cur_s, cur_e = 0.0, [], dec[0][0], dec[0][1]
for s, e in dec[1:]:
    if s > cur_e:
        busy += cur_e - cur_s
        gaps.append(s - cur_e)
        cur_s, cur_e = s, e
    else:
        cur_e = max(cur_e, e)
busy += cur_e - cur_s
span = dec[-1][1] - dec[0][0]
big = [g for g in gaps if g > 20]
print(f"{quant} batch {batch}: run {wall:.2f} s unprofiled; decode span {span / 1e3:.1f} ms, "
      f"GPU busy {busy / 1e3:.1f} ms ({busy / span:.1%}); gaps > 20 us: {len(big)}, "
      f"{sum(big) / 1e3:.1f} ms; all gaps {sum(gaps) / 1e3:.1f} ms over {len(gaps)}")
