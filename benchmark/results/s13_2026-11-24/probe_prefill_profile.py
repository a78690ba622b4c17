"""Probe (session 13): where a prefill step of 8,192 tokens goes (the offline run's "mixed"
steps are such chunks plus the running decodes), FP8 (``--quantization fp8``) against bf16:
torch.profiler's kernel table over 4 such steps (8 prompts of 1,024 tokens, 1 token each)."""
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "offline"))

from bench import model_dir  # noqa: E402
from minisgl import LLM, SamplingParams  # noqa: E402

quant = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "none" else None
path, dummy = model_dir("benchmark/configs/qwen3-8b.json")
llm = LLM(path, dummy_weights=dummy, num_pages=65536, quantization=quant)
params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0)


def prompts(seed):
    return [[(seed * 131 + 7 * i + j) % 30000 for j in range(1024)] for i in range(8)]


llm.generate(prompts(0), params, use_tqdm=False)
torch.cuda.synchronize()
tic = time.perf_counter()
for s in range(1, 5):
    llm.generate(prompts(s), params, use_tqdm=False)
torch.cuda.synchronize()
print(f"{quant}: {(time.perf_counter() - tic) / 4 * 1e3:.1f} ms per 8,192-token prefill")
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for s in range(5, 9):
        llm.generate(prompts(s), params, use_tqdm=False)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
llm.close()
