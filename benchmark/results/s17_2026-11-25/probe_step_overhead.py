"""How much of a batch-1 decode step is outside the CUDA graph: the engine's ms per token
(bench.run_batch1's method) against back-to-back replays of the same graph (no batch preparation,
no sampling, no copies). Usage: probe_step_overhead.py MODEL [fp8|default] ..."""
import gc
import json
import random
import sys
import time

import torch

import minisgl  # first: from PYTHONPATH (an A/B may point it at another checkout)
from minisgl import LLM, SamplingParams

sys.path.insert(0, "benchmark/offline")
from bench_common import model_dir  # noqa: E402

model = sys.argv[1]
for variant in sys.argv[2:]:
    opts = {"quantization": "fp8"} if variant == "fp8" else {}
    path, dummy = model_dir(model)
    llm = LLM(path, dummy_weights=dummy, **opts)
    prompt = [random.Random(1).randint(0, 10000) for _ in range(128)]
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    full = SamplingParams(temperature=0, max_tokens=256, ignore_eos=True)
    llm.generate([prompt], full, use_tqdm=False)
    engine_ms = []
    for _ in range(5):
        times = []
        for params in (first, full):
            torch.cuda.synchronize()
            t = time.perf_counter()
            llm.generate([prompt], params, use_tqdm=False)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        engine_ms.append(1000 * (times[1] - times[0]) / 255)
    graph = llm.scheduler.engine.graph_runner.graphs[1]
    replay_ms = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(255):
            graph.replay()
        torch.cuda.synchronize()
        replay_ms.append(1000 * (time.perf_counter() - t) / 255)
    print(json.dumps({"code": minisgl.__file__, "model": model, "variant": variant, "engine_ms": [round(x, 4) for x in engine_ms],
                      "graph_replay_ms": [round(x, 4) for x in replay_ms]}), flush=True)
    llm.close()
    del llm, graph
    gc.collect()
    torch.cuda.empty_cache()
