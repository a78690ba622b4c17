"""Streams under load through the in-process scheduler: where the long gaps between tokens come
from.

    python benchmark/online/step_streams.py --model benchmark/configs/qwen3-8b.json \
        --concurrency 64 --modes prefill-first,mixed-512,mixed-1024

The streaming-smoothness serving workload (random prompts of 512-1024 tokens, 128-256 output tokens,
ignore_eos, CONCURRENCY requests in flight: a finished one is replaced at once) is driven through
``Scheduler.step`` with no HTTP, tokenizer or detokenizer process. A token's time is when the step
that returns it returns, so the gaps here are the scheduler's own; the difference to the online
benchmark (``bench_serving.py``) is what the server's other processes and the client add. Besides
the ITL and TTFT figures, every step is classified by the batch it read back (pure decode; mixed or
prefill, by its prefill tokens) with its count and median / P99 / max duration.
A ``.json`` model is a bare config with random weights.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import gpu_name, model_dir, project_commit  # noqa: E402

from minisgl import LLM, SamplingParams  # noqa: E402
from minisgl.benchmark.perf import describe  # noqa: E402
from minisgl.llm.config import EngineOptions  # noqa: E402
from minisgl.utils.heap import freeze_heap  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def workload(n: int, seed: int, vocab: int = 10000) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(512, 1024))], rng.randint(128, 256))
            for _ in range(n)]


def mode_options(mode: str, path: str) -> dict:
    """``prefill-first``, ``mixed`` (the server's default budget) or ``mixed-N``."""
    if mode == "prefill-first":
        return {"schedule_mode": "prefill-first"}
    if mode == "mixed":
        budget = EngineOptions().default_batched_tokens(torch.device(DEVICE), True, path)
        return {"schedule_mode": "mixed", "max_num_batched_tokens": budget}
    return {"schedule_mode": "mixed", "max_num_batched_tokens": int(mode.removeprefix("mixed-"))}


class Steps:
    """The batch each step read back (overlap: the one launched by the step before) and its time."""

    def __init__(self, sched, profile: int = 0) -> None:
        self.profile, self.profiler = profile, cProfile.Profile()
        self.profiled = 0  # mixed launches profiled so far
        self.launched: list[tuple[int, int]] = []  # (decode rows, prefill tokens)
        self.rows: list[tuple[float, int, int]] = []  # (return time, decode rows, prefill tokens)
        launch = sched._launch

        def traced(*args):
            res = launch(*args)
            if res is not None:
                batch = res.plan.batch
                n_dec = batch.num_decode_rows
                self.launched.append((n_dec, sum(r.extend_len for r in batch.feeds[n_dec:])))
            return res

        sched._launch = traced
        # host time of each phase of a launch, by the kind of batch launched
        self.host: dict[str, dict[str, list[float]]] = {}
        self._phase: dict[str, float] = {}
        for name, owner, attr in (("schedule", sched.planner, "plan"),
                                  ("forward", sched.engine, "forward"),
                                  ("finish", sched, "_read_back")):
            setattr(owner, attr, self._timed(name, getattr(owner, attr)))

    def _timed(self, name: str, fn):
        def wrapped(*args):
            t0 = time.perf_counter()
            if name == "forward" and args[0].is_mixed and self.profile > 0:
                self.profile -= 1
                self.profiled += 1
                res = self.profiler.runcall(fn, *args)
            else:
                res = fn(*args)
            self._phase[name] = time.perf_counter() - t0
            if name == "forward":
                batch = args[0]
                kind = "decode" if batch.is_decode else batch.phase
                per = self.host.setdefault(kind, {})
                for k, v in self._phase.items():
                    per.setdefault(k, []).append(v)
                self._phase.clear()
            return res
        return wrapped

    def host_summary(self) -> dict:
        return {kind: {k: round(1000 * sum(v) / len(v), 2) for k, v in per.items()} | {
                       "launches": len(per["forward"])} for kind, per in self.host.items()}

    def read_back(self, now: float, launched_before: int, inflight_before: bool) -> None:
        """A step returned at ``now``: record the batch it read back (none when it launched the
        first one of an overlapped run)."""
        n = launched_before
        done = n - 1 if inflight_before else (n if len(self.launched) > n else None)
        if done is not None and done >= 0:
            self.rows.append((now, *self.launched[done]))

    def summary(self, start: float) -> dict:
        """Per kind of batch read back: the time between consecutive step returns."""
        stamps = [start] + [r[0] for r in self.rows]
        kinds: dict[str, list[float]] = {}
        for prev, (now, _, prefill) in zip(stamps, self.rows):
            secs = now - prev
            key = "decode" if prefill == 0 else f"prefill<={_ceil_pow2(prefill)}"
            kinds.setdefault(key, []).append(secs)
        return {k: {"steps": len(v), **{q: round(d, 2) for q, d in describe(v).items()
                                         if q in ("p50", "p99", "max")}}
                for k, v in sorted(kinds.items(), key=lambda kv: (len(kv[0]), kv[0]))}


class GcPauses:
    """The garbage collector's pauses while it is alive, by generation."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses[info["generation"]].append((time.perf_counter() - self._start) * 1e3)

    def close(self) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {f"gen{g}": {"count": len(p), "max": round(max(p, default=0.0), 2),
                            "total": round(sum(p), 1)} for g, p in self.pauses.items()}


def _ceil_pow2(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


def run(path: str, dummy: bool, mode: str, concurrency: int, requests, options: dict,
        profile: int = 0) -> dict:
    """``profile``: print where the host's time of that many mixed launches goes (cProfile)."""
    llm = LLM(path, dummy_weights=dummy, **mode_options(mode, path), **options)
    sched = llm.scheduler
    # warm-up with other prompts (the timed ones must miss the prefix cache): Triton compiles then
    for i, (prompt, _) in enumerate(workload(concurrency, seed=1)):
        sched.add_request(-1 - i, prompt,
                          SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    while sched.has_work:
        sched.step()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    freeze_heap()  # as the server's processes do
    pauses = GcPauses()
    steps = Steps(sched, profile)
    queue = list(enumerate(requests))
    added: dict[int, float] = {}
    last: dict[int, float] = {}
    ttft, itl = [], []
    out_tokens = 0
    start = time.perf_counter()
    while queue or sched.has_work:
        while queue and len(added) < concurrency:
            uid, (prompt, n_out) = queue.pop(0)
            sched.add_request(uid, prompt, SamplingParams(temperature=0, max_tokens=n_out,
                                                          ignore_eos=True))
            added[uid] = time.perf_counter()
        n, inflight = len(steps.launched), sched._inflight is not None
        outs = sched.step()
        now = time.perf_counter()
        steps.read_back(now, n, inflight)
        for tok in outs:
            out_tokens += tok.token is not None
            if tok.uid in last:
                itl.append(now - last[tok.uid])
            else:
                ttft.append(now - added[tok.uid])
            last[tok.uid] = now
            if tok.finish_reason is not None:
                del added[tok.uid], last[tok.uid]
    seconds = time.perf_counter() - start
    pauses.close()
    gc.unfreeze()  # the next mode's engine needs this one's memory: let its cycles be collected
    if profile and steps.profiled:
        print(f"--- {mode}: host time of {steps.profiled} mixed launches")
        pstats.Stats(steps.profiler).sort_stats("tottime").print_stats(40)
    result = {"mode": mode, "concurrency": concurrency, "requests": len(requests),
              "output_tok_per_s": round(out_tokens / seconds, 1), "seconds": round(seconds, 2),
              "itl_ms": describe(itl), "ttft_ms": describe(ttft), "steps": steps.summary(start),
              "gc_ms": pauses.summary(),
              "host_ms": steps.host_summary(),
              "retractions": sched.num_retractions,
              "budget": sched.config.max_num_batched_tokens if sched.config.mixed else None}
    llm.close()
    del llm, sched, steps
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return result


def table(results: list[dict]) -> list[str]:
    base = results[0]
    lines = ["| mode | budget | output tok/s | vs first | median ITL | P99 ITL | max ITL | "
             "P99/median | mean TTFT | P99 TTFT |", "|" + "---|" * 10]
    for r in results:
        itl, ttft = r["itl_ms"], r["ttft_ms"]
        lines.append(f"| {r['mode']} | {r['budget'] or '-'} | {r['output_tok_per_s']:,.0f} | "
                     f"{r['output_tok_per_s'] / base['output_tok_per_s']:.3f}x | "
                     f"{itl['p50']:.1f} | "
                     f"{itl['p99']:.1f} | {itl['max']:.0f} | {itl['p99'] / itl['p50']:.2f} | "
                     f"{ttft['mean']:.0f} | {ttft['p99']:.0f} |")
    lines += ["", "Host time of a launch, mean ms (schedule: pick the batch; forward: the engine's "
              "launch, not its device time; finish: the previous step's read-back):", "",
              "| mode | batch launched | launches | schedule | forward | finish |",
              "|---|---|---|---|---|---|"]
    for r in results:
        for kind, h in r["host_ms"].items():
            lines.append(f"| {r['mode']} | {kind} | {h['launches']} | {h.get('schedule', '')} | "
                         f"{h['forward']} | {h.get('finish', '')} |")
    lines += ["", "| mode | step read back | steps | median ms | P99 ms | max ms |",
              "|---|---|---|---|---|---|"]
    for r in results:
        for kind, s in r["steps"].items():
            lines.append(f"| {r['mode']} | {kind} | {s['steps']} | {s['p50']} | {s['p99']} | "
                         f"{s['max']} |")
    lines += ["", "Garbage-collector pauses during the run (the start-up heap frozen, as in the "
              "server):", "", "| mode | generation | collections | max ms | total ms |",
              "|---|---|---|---|---|"]
    for r in results:
        for gen, g in r["gc_ms"].items():
            lines.append(f"| {r['mode']} | {gen} | {g['count']} | {g['max']} | {g['total']} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF directory, or a config.json (dummy weights)")
    p.add_argument("--modes", default="prefill-first,mixed", help="prefill-first, mixed, mixed-N")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4, help="requests = rounds x concurrency")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--piecewise-cuda-graph-max-tokens", type=int,
                   help="the engine option (default: the engine's); "
                        "every mode is capped by its budget")
    p.add_argument("--profile", type=int, default=0,
                   help="print where the host's time of this many mixed launches goes (cProfile)")
    p.add_argument("--out", default="bench-out", help="results (./bench-out)")
    p.add_argument("--tag", default="")
    args = p.parse_args()
    path, dummy = model_dir(args.model)
    options = ({"max_running_requests": args.max_running_requests}
               if args.max_running_requests else {})
    if args.piecewise_cuda_graph_max_tokens is not None:
        options["piecewise_cuda_graph_max_tokens"] = args.piecewise_cuda_graph_max_tokens
    requests = workload(args.rounds * args.concurrency, seed=0)
    results = []
    for mode in args.modes.split(","):
        results.append(run(path, dummy, mode, args.concurrency, requests, options, args.profile))
        print(json.dumps(results[-1]), flush=True)
    name = os.path.basename(args.model).removesuffix(".json")
    stem = f"steps_{name}_{gpu_name()}_c{args.concurrency}{'_' + args.tag if args.tag else ''}"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"model": name, "gpu": gpu_name(), "commit": project_commit(),
                   "runs": results}, f, indent=1)
    lines = [f"### {name}, {args.concurrency} streams, in-process scheduler (ms)", "",
             *table(results)]
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
