"""Where a batch-1 decode step's time outside its CUDA graph goes (Qwen3-8B, FP8 weights): ms per
step of back-to-back loops that add, one at a time, what the engine does around the replay: (a) the
graph alone; (b) with the step's two host-to-device copies (inputs, attention metadata); (c) with
the tokens' copy back and an event; (d) with the host waiting for each step's event before the next
launch's copies (no overlap); and the engine itself (``bench.run_batch1``'s method)."""
import json
import random
import sys
import time

import torch

import minisgl  # noqa: F401  (from PYTHONPATH)
from minisgl import LLM, SamplingParams

sys.path.insert(0, "benchmark/offline")
from bench_common import model_dir  # noqa: E402

path, dummy = model_dir("benchmark/configs/qwen3-8b.json")
llm = LLM(path, dummy_weights=dummy, quantization="fp8")
prompt = [random.Random(1).randint(0, 10000) for _ in range(128)]
llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
runner = llm.scheduler.engine.graph_runner
graph = runner.graphs[1]
dev_in = runner.inputs[:4].view(4, 1)
backend = llm.scheduler.engine.attn_backend
dev_meta = backend._graph_bufs[:3].view(3, 1)
in_now, meta_now = dev_in.cpu(), dev_meta.cpu()
N = 255


def loop(copies: bool, back: bool, wait: bool) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    event = None
    for _ in range(N):
        if copies:
            dev_in.copy_(in_now.clone().pin_memory(), non_blocking=True)
            dev_meta.copy_(meta_now.clone().pin_memory(), non_blocking=True)
        graph.replay()
        if back:
            host = runner.tokens[:1].to("cpu", non_blocking=True)
            if wait and event is not None:
                event.synchronize()
            event = torch.cuda.Event()
            event.record()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t) / N


res = {}
for rep in range(3):
    for name, args in (("a_graph", (False, False, False)), ("b_copies", (True, False, False)),
                       ("c_copy_back", (True, True, False)), ("d_wait_each", (True, True, True))):
        res.setdefault(name, []).append(round(loop(*args), 4))
first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
full = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
for _ in range(5):
    times = []
    for params in (first, full):
        torch.cuda.synchronize()
        t = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    res.setdefault("engine", []).append(round(1000 * (times[1] - times[0]) / 255, 4))
print(json.dumps(res), flush=True)
llm.close()
