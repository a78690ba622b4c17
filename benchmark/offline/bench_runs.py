"""The runs ``bench.py`` times, each returning its figures as a dict: minisgl's throughput on the
workload (``run_minisgl``; ``structured``: half the requests under ``LONG_JSON``), one request's
decode latency (``run_batch1``) and transformers' batched generate (``run_hf``). Each run closes its
engine and empties the CUDA cache before returning, so the next one starts with the GPU free."""

from __future__ import annotations

import gc
import json
import random
import statistics
import time

import torch
from bench_common import StepTrace, environment

from minisgl import LLM, SamplingParams

# --structured: half the requests carry this schema; a string of at least 8192 characters keeps the
# grammar open for more than the longest output (1024 tokens), so every request still ends by length
# and both runs produce the same tokens count
# minLength keeps a constrained request going for its whole max_tokens, like ignore_eos. Its price:
# xgrammar's accept_token inside a long minLength string grows with the position (CPU, xgrammar
# 0.2.8: 2 us per token at 200 tokens, 1.7 ms at 600, 6 ms at 1200), so this workload measures
# that more than the engine's share of structured output.
LONG_JSON = json.dumps({"type": "object", "required": ["id", "text"], "properties": {
    "id": {"type": "integer"}, "text": {"type": "string", "minLength": 8192}}})


def llm_options(variant: dict) -> dict:
    """A variant's ``LLM`` options: all but its requests' sampling and its environment."""
    return {k: v for k, v in variant.items() if k not in ("sampling", "env")}


def run_minisgl(path: str, dummy: bool, prompts, max_tokens, variant: dict, tp: int = 1,
                structured: bool = False) -> dict:
    """``structured``: every other request is constrained by ``LONG_JSON``."""
    options = llm_options(variant)
    with environment(variant.get("env", {})):
        return _run_minisgl(path, dummy, prompts, max_tokens, options, variant.get("sampling"), tp,
                            structured)


def _run_minisgl(path, dummy, prompts, max_tokens, options: dict, sampling: dict | None,
                 tp: int, structured: bool) -> dict:
    llm = LLM(path, tp=tp, dummy_weights=dummy, **{"warmup": "off", **options})  # its own below
    trace = StepTrace(llm)
    sampling = sampling or {"temperature": 0}
    schema = lambda i: LONG_JSON if structured and i % 2 == 0 else None  # noqa: E731
    params = [SamplingParams(max_tokens=m, ignore_eos=True, seed=i, json_schema=schema(i),
                             **sampling) for i, m in enumerate(max_tokens)]
    # warm-up with the timed run's settings: compiles the grammar and the kernel variants
    warm = [SamplingParams(max_tokens=16, ignore_eos=True, seed=i, json_schema=schema(i),
                           **sampling) for i in range(8)]
    llm.generate(prompts[:8], warm, use_tqdm=False)
    torch.cuda.synchronize()
    trace.start()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    result = {"output_tokens": sum(len(o.token_ids) for o in outs), "seconds": seconds,
              "retractions": llm.scheduler.num_retractions,
              "kv_pages": llm.scheduler.engine.num_pages,
              "kv_tokens": llm.scheduler.engine.num_pages * llm.scheduler.engine.config.page_size,
              "tp": tp}
    result.update(memory(llm))
    result["trace"] = trace.summary()
    del trace  # its hooks hold the scheduler: the next run needs the memory back
    llm.close()  # CUDA graphs (and the TP group) go now, before the next run allocates
    del llm, outs
    gc.collect()
    torch.cuda.empty_cache()
    return result


def memory(llm: LLM) -> dict:
    """What rank 0's weights take on the GPU, and the most it held while loading them (a model
    quantized at load: about the quantized model plus one layer unquantized)."""
    engine = llm.scheduler.engine
    peak = engine.load_peak_bytes
    return {"weight_gib": round(engine.weight_bytes / (1 << 30), 2),
            "load_peak_gib": None if peak is None else round(peak / (1 << 30), 2)}


def token_times(llm: LLM, prompt: list[int], params: SamplingParams) -> list[float]:
    """Host clock at which each token of one request came back from the scheduler."""
    sched, uid = llm.scheduler, 1 << 50
    sched.add_request(uid, prompt, params)
    times, done = [], False
    while not done:
        for tok in sched.step():
            if tok.uid == uid:
                times.append(time.perf_counter())
                done = tok.finish_reason is not None
    sched.drain()
    return times


def run_batch1(path: str, dummy: bool, options: dict, new_tokens: int = 256,
               tp: int = 1, runs: int = 3) -> dict:
    """Decode latency of one request from its own token timestamps: (last - first) / (tokens -
    1), the median of ``runs`` runs after an untimed one that compiles what they use."""
    llm = LLM(path, tp=tp, dummy_weights=dummy, **{"warmup": "off", **options})
    mem = memory(llm)
    prompt = [random.Random(1).randint(0, 10000) for _ in range(128)]
    full = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    token_times(llm, prompt, full)  # warm-up
    per_run = []
    for _ in range(runs):
        times = token_times(llm, prompt, full)
        per_run.append(1000 * (times[-1] - times[0]) / (len(times) - 1))
    llm.close()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return {"ms_per_token": statistics.median(per_run), "ms_per_token_runs": per_run, "tp": tp,
            **mem}


def run_hf(path: str, dummy: bool, prompts, max_tokens, batch_size: int) -> dict:
    """transformers' batched generate (bf16, SDPA, KV cache), left-padded, longest first."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(path)
    if dummy:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda")
    model.eval()
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    useful = 0
    torch.cuda.synchronize()
    start = time.perf_counter()
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]):] = 1
        steps = max(max_tokens[i] for i in idx)
        gen = GenerationConfig(do_sample=False, max_new_tokens=steps, min_new_tokens=steps,
                               pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), generation_config=gen)
        useful += sum(max_tokens[i] for i in idx)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return {"output_tokens": useful, "seconds": seconds}
