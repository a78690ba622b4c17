"""The workloads of ``bench_spec.py``: code editing and chat, decoded with every method on one
engine, the methods interleaved.

All methods run in one process on one engine, its scheduler's ``SpecDecoder`` swapped between
runs (``none``: no decoder). Separate processes differed by up to 50% at batch 64 from one
another (the host bounds a 135M model's step there), which hid the few percent that matter;
here each repeat runs every method once, in a rotating order, and a method's time is the median
of its repeats. Only the model-free methods (ngram, suffix) can share an engine this way.
"""

from __future__ import annotations

import gc
import json
import os
import time

import torch

from minisgl import LLM, SamplingParams
from minisgl.speculative import create_spec_decoder, parse_speculative_config

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = [("python/minisgl/scheduler/decode.py", "DecodeManager", "RunningRequests"),
           ("python/minisgl/speculative/adaptive.py", "Acceptance", "AcceptanceTracker"),
           ("python/minisgl/scheduler/policy.py", "AdmissionPolicy", "QueueOrder")]
CHATS = ["What are the main differences between a process and a thread?",
         "Give me three tips to sleep better.",
         "Explain what a hash map is to a beginner.",
         "Write a short story about a robot who learns to paint."]
METHODS = ("none", "ngram", "suffix")


def code_texts() -> list[str]:
    """The code-editing requests: a source file of this tree and a rename in it."""
    root = os.path.join(HERE, "..", "..")
    texts = []
    for path, old, new in SOURCES:
        with open(os.path.join(root, path)) as f:
            source = f.read()
        texts.append(f"Here is a Python file:\n\n```python\n{source}```\n\nRename the class "
                     f"`{old}` to `{new}` everywhere. Reply with the whole updated file and "
                     "nothing else.")
    return texts


def code_prompts(llm: LLM) -> list[list[int]]:
    return [llm.apply_chat_template([{"role": "user", "content": text}])
            for text in code_texts()]


def chat_prompts(llm: LLM) -> list[list[int]]:
    return [llm.apply_chat_template([{"role": "user", "content": q}]) for q in CHATS]


def spec_config(method: str, k: int | None, options: str | None = None) -> dict | None:
    """``k``: the most drafts (None: the method's default); ``options``: more of the config, as
    JSON (e.g. '{"adaptive": false}')."""
    if method == "none":
        return None
    drafts = {"num_speculative_tokens": k} if k else {}
    return {"method": method, **drafts, **json.loads(options or "{}")}


class GcClock:
    """Seconds the garbage collector ran while installed (its pauses stall every request)."""

    def __init__(self) -> None:
        self.seconds, self._start = 0.0, 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start


GC_CLOCK = GcClock()


def run_workload(llm: LLM, prompts, params, batch: int) -> tuple[list[list[int]], float, int]:
    """Token ids per prompt, wall seconds, output tokens; ``batch`` prompts at a time. Each
    group's prompts are prefilled first (into the prefix cache), so the time is the decode's."""
    outs, tokens, secs = [], 0, 0.0
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        llm.generate(group, SamplingParams(max_tokens=1), use_tqdm=False)
        start = time.perf_counter()
        for o in llm.generate(group, params, use_tqdm=False):
            outs.append(o.token_ids)
            tokens += len(o.token_ids)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        secs += time.perf_counter() - start
    return outs, secs, tokens


def bench_workloads(args, base: dict) -> list[dict]:
    """Every workload at batch 1 and ``--batch`` with every method: one record each."""
    methods = args.methods.split(",")  # a method, or method:k for k drafts (--num-spec-tokens)
    draft_lens = {m: int(m.partition(":")[2] or 0) or args.num_spec_tokens for m in methods}
    if not {m.partition(":")[0] for m in methods} <= set(METHODS):
        raise ValueError(f"--methods: the workloads run {', '.join(METHODS)} (each may be "
                         f"method:k), not {methods}")
    configs = {m: spec_config(m.partition(":")[0], draft_lens[m], args.spec_options)
               for m in methods}
    llm = LLM(args.model, device=args.device, cuda_graph_bs=tuple(args.cuda_graph_bs or ()),
              speculative_config=next((c for c in configs.values() if c), None))
    sched = llm.scheduler
    decoders = {m: c and create_spec_decoder(parse_speculative_config(c), sched.engine)
                for m, c in configs.items()}
    workloads = {"code": code_prompts(llm), "chat": chat_prompts(llm)}
    shapes = [(name, batch) for name in args.workloads.split(",")
              for batch in sorted({1, args.batch})]

    def prompts_of(name: str, batch: int) -> list[list[int]]:
        prompts = workloads[name]
        return prompts if batch == 1 else (prompts * -(-batch // len(prompts)))[:batch]

    def run(method: str, prompts, params, batch: int):
        sched.spec = decoders[method]
        if sched.spec is not None:  # nothing learned from an earlier run of the same prompts
            sched.spec.reset()
        return run_workload(llm, prompts, params, batch)

    for method in methods:  # untimed: every shape each run will meet (kernels compile here)
        for name, batch in shapes:
            run(method, prompts_of(name, batch), SamplingParams(max_tokens=16), batch)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    records = []
    for name, batch in shapes:
        times: dict[str, list[float]] = {m: [] for m in methods}
        gc_secs: dict[str, list[float]] = {m: [] for m in methods}
        last: dict[str, tuple] = {}
        for r in range(args.repeats):
            for method in methods[r % len(methods):] + methods[: r % len(methods)]:
                before = GC_CLOCK.seconds
                outs, secs, tokens = run(method, prompts_of(name, batch), params, batch)
                times[method].append(secs)
                gc_secs[method].append(GC_CLOCK.seconds - before)
                spec = decoders[method]
                last[method] = (outs, tokens, spec and (
                    spec.stats.verify_steps, spec.stats.draft_tokens, spec.stats.accepted_tokens,
                    spec.stats.ahead_feeds, spec.stats.ahead_dropped))
        for method in methods:
            outs, tokens, stats = last[method]
            steps, drafts, accepted, ahead, dropped = stats or (0, 0, 0, 0, 0)
            secs = sorted(times[method])[len(times[method]) // 2]
            rec = dict(base, kind="workload", workload=name, method=method, batch=batch,
                       num_spec_tokens=stats and decoders[method].config.num_speculative_tokens,
                       prompts=len(outs), output_tokens=tokens, seconds=round(secs, 3),
                       runs=[round(t, 3) for t in times[method]],
                       gc_seconds=[round(t, 3) for t in gc_secs[method]],
                       tokens_per_s=round(tokens / secs, 2),
                       mean_accepted_len=round((accepted + steps) / steps, 3) if steps else 0,
                       acceptance_rate=round(accepted / drafts, 3) if drafts else 0,
                       verify_steps=steps, drafted_ahead=ahead, dropped=dropped,
                       identical_to_baseline=outs == last.get("none", last[methods[0]])[0])
            records.append(rec)
            print(json.dumps(rec), flush=True)
    llm.close()
    for rec in records:
        ref = next((r for r in records if r["method"] == "none" and r["workload"] == rec["workload"]
                    and r["batch"] == rec["batch"]), None)
        rec["speedup"] = round(rec["tokens_per_s"] / ref["tokens_per_s"], 3) if ref else None
    return records
