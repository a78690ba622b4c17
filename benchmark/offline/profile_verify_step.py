"""Where the time of a speculative step goes (batch 1, or ``--batch N`` requests), on the host:
the wall time of the scheduler's phases per step, for plain decode steps (overlap on) and for
verify steps of k drafts.

    python benchmark/offline/profile_verify_step.py --model benchmark/configs/smollm2-135m.json
    python benchmark/offline/profile_verify_step.py --batch 64 \\
        --model benchmark/configs/qwen3-8b.json

A proposer that always drafts k tokens (``--reject``: tokens the model will not pick, so every
step rejects its drafts and gives KV back) feeds each request; each phase is timed by wrapping the
scheduler's methods: ``schedule`` (the batch, drafts included), ``flush`` (page-table copy),
``prepare`` (the batch's device inputs and the drafts' write), ``forward`` (the host's side of the
launch), ``wait`` (the host waiting for the device: the GPU time left after the launch), ``finish``
(the read-back without ``wait``: verdicts, commits, stops, outputs). A plain step with overlap
waits for the forward launched one step before, so its ``wait`` is what the host could not hide;
a verify step is read back at once.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

import torch
from bench_common import gpu_name, model_dir, project_commit
from bench_spec import FixedDrafts

from minisgl import LLM, SamplingParams
from minisgl.engine.engine import ForwardOutput

PHASES = ("schedule", "flush", "prepare", "forward", "wait", "finish")


class WrongDrafts(FixedDrafts):
    """``k`` copies of the last token plus one: a random-weight model rarely picks them, so nearly
    every step rejects its drafts and gives their KV back."""

    def propose(self, req, max_len: int) -> list[int]:
        return [(req.input_ids[-1] + 1) % 1000] * min(self.k, max_len)


def timed_phases(sched) -> collections.defaultdict:
    """Accumulate seconds per phase from now on (wraps the scheduler's and engine's methods)."""
    acc: collections.defaultdict = collections.defaultdict(float)

    def wrap(obj, name: str, phase: str) -> None:
        fn = getattr(obj, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[phase] += time.perf_counter() - start

        setattr(obj, name, timed)

    wrap(sched.planner, "plan", "schedule")
    wrap(sched.cache, "flush", "flush")
    wrap(sched.engine, "prepare", "prepare")
    wrap(sched.engine, "forward", "forward")
    wrap(sched, "_read_back", "finish")
    wait = ForwardOutput.wait

    def timed_wait(out) -> None:
        start = time.perf_counter()
        wait(out)
        acc["wait"] += time.perf_counter() - start

    ForwardOutput.wait = timed_wait
    return acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="benchmark/configs/smollm2-135m.json")
    parser.add_argument("--ks", default="0,1,2,4,7", help="draft lengths (0: plain decode)")
    parser.add_argument("--prompt-len", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=200, help="output tokens per run")
    parser.add_argument("--reject", action="store_true", help="drafts that are always rejected")
    parser.add_argument("--batch", type=int, default=1, help="requests verifying together")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args()

    path, dummy = model_dir(args.model)
    config = {"method": "ngram", "num_speculative_tokens": 8, "adaptive": False}
    config["disable_by_batch_size"] = max(args.batch, 4)
    llm = LLM(path, dummy_weights=dummy, warmup="off", speculative_config=config,
              max_running_requests=max(args.batch, 8))
    sched = llm.scheduler
    spec = sched.spec
    prompts = [[(7 * j + i) % 1000 + 10 for j in range(args.prompt_len)]
               for i in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.steps, ignore_eos=True)
    acc = timed_phases(sched)
    base = dict(model=os.path.basename(args.model), gpu=gpu_name(), commit=project_commit(),
                reject=args.reject, batch=args.batch)
    records = []
    for rep in range(2):  # the first pass compiles and captures: only the second is kept
        for k in (int(x) for x in args.ks.split(",")):
            sched.spec = spec if k else None
            spec.proposer = (WrongDrafts if args.reject else FixedDrafts)(k)
            for i, prompt in enumerate(prompts):
                sched.add_request(10**6 * rep + 1000 * k + i, prompt, params)
            for _ in range(3):  # the prefill and the first steps
                sched.step()
            acc.clear()
            steps = tokens = 0
            start = time.perf_counter()
            while sched.has_work:
                tokens += len(sched.step())
                steps += 1
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
            acc["finish"] -= acc["wait"]  # the read-back's own work
            rec = dict(base, k=k, steps=steps, tokens=tokens,
                       ms_per_step=round(wall * 1e3 / steps, 3),
                       ms_per_token=round(wall * 1e3 / tokens, 3),
                       **{p: round(acc[p] * 1e3 / steps, 3) for p in PHASES})
            if rep:
                records.append(rec)
                print(json.dumps(rec), flush=True)
    llm.close()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "spec_step_phases" + ("_reject" if args.reject else "")
                        + (f"_bs{args.batch}" if args.batch > 1 else ""))
    with open(stem + ".json", "w") as f:
        json.dump(records, f, indent=1)
    lines = [f"`profile_verify_step.py --model {args.model}"
             + (" --reject" if args.reject else "")
             + f"` on {base['gpu']}, commit "
             f"`{base['commit']}`: ms per step (batch {args.batch}, {args.prompt_len}-token "
             "prompts).", "",
             "| k | ms/step | ms/token | " + " | ".join(PHASES) + " |",
             "|---|---|---|" + "---|" * len(PHASES)]
    lines += [f"| {r['k']} | {r['ms_per_step']} | {r['ms_per_token']} | "
              + " | ".join(str(r[p]) for p in PHASES) + " |" for r in records]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
