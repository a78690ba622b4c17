"""The host's cost of a speculative step, without a GPU: the real scheduler, cache and proposers
(``ngram``, ``suffix``) over a tiny random model on the CPU, with the forward replaced by a
scripted target on a simulated device (``SimDevice``).

    python benchmark/offline/verify_host_cost.py
    python benchmark/offline/verify_host_cost.py --batch 1 --methods suffix --profile
    python benchmark/offline/verify_host_cost.py --tree .kitchen-old   # another checkout's python/

Each request's prompt is a random "file" plus an instruction; the target copies the file, with
one token changed every ``--edit-every`` tokens (a rejected draft there, so the acceptance is
controlled and the same for every tree). The simulated device runs one forward after another,
each ready a fixed time after it started: one time for a forward of one row, one for more rows
(``--device-ms ONE/MORE,...``; the default's second pair is SmolLM2-135M's decode graphs on an
H200: 0.5 ms at one row, 0.9-1.0 ms at 2-16, docs/performance.md). Time is simulated too: the
host's clock is its thread's CPU time, so that another process on the same cores does not count.
With no device time the wall time is the host's alone; with a real forward's it shows what of
the host's work overlaps the device.

Reported per method and batch: the forwards of the decode phase (after every prompt is
prefilled), how many verified drafts, output tokens per forward, and per forward the wall time
and the host time (the wall time less the wait for the device; the stub's own time is left out
of both), and the wall time per output token. ``--profile``: cProfile's top entries of the
decode phase (with no device time).

The script runs against any checkout whose ``python/minisgl`` has ``LLM`` and the engine's
``ForwardOutput`` (``--tree``), such as the scheduler before its redesign.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import tempfile
import time
import types

import torch
from spec_ab_worker import spec_counts  # this directory: the script's own

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            head_dim=32, num_hidden_layers=2)


def tiny_model(config: str) -> str:
    """A config.json with ``config``'s vocabulary and a tiny body (random weights)."""
    with open(config) as f:
        raw = json.load(f)
    raw.update(TINY)
    path = tempfile.mkdtemp(prefix="minisgl-verify-host-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(raw, f)
    return path


def workload(batch: int, file_len: int, max_tokens: int, edit_every: int, vocab: int,
             seed: int) -> tuple[list[list[int]], dict[int, list[int]]]:
    """Prompts (a file, then an instruction) and per uid the script: the prompt, then the file
    copied cyclically with every ``edit_every``-th token replaced."""
    rng = random.Random(seed)
    prompts, scripts = [], {}
    for uid in range(batch):
        file = [rng.randrange(3, vocab) for _ in range(file_len)]
        prompt = file + [rng.randrange(3, vocab) for _ in range(16)]
        out = [file[j % file_len] for j in range(max_tokens + 64)]
        for j in range(edit_every - 1, len(out), edit_every):
            out[j] = rng.randrange(3, vocab)
        prompts.append(prompt)
        scripts[uid] = prompt + out
    return prompts, scripts


class Ready:
    """A forward's host copy, done at ``at`` on the device's clock: ``synchronize`` moves the
    host's clock there."""

    def __init__(self, device: SimDevice, at: float) -> None:
        self.device, self.at = device, at

    def synchronize(self) -> None:
        self.device.wait_until(self.at)


class SimDevice:
    """The engine's forward: the token sampled at position p of request uid is
    ``script[uid][p + 1]`` (written to the token pool as the sampler does), ready ``device_s``
    (one row, more rows) after the forward starts; forwards run one after another.

    Time is simulated, so that another process on the same cores does not count: the host's clock
    is this thread's CPU time (``time.thread_time``) plus the time it spent waiting for the
    device, less the stub's own time."""

    def __init__(self, scheduler, script: dict[int, list[int]], device_s: tuple[float, float],
                 ForwardOutput, SampleOutput) -> None:
        self.scheduler, self.script, self.device_s = scheduler, script, device_s
        self.types = ForwardOutput, SampleOutput
        self.skew = self.free_at = 0.0
        self.reset()
        scheduler.engine.forward = self.forward
        # the scheduler times its steps (the adaptive draft length) on the simulated clock
        sys.modules[type(scheduler).__module__].time = types.SimpleNamespace(
            perf_counter=self.now)

    def now(self) -> float:
        return time.thread_time() + self.skew

    def wait_until(self, at: float) -> None:
        idle = at - self.now()
        if idle > 0:
            self.skew += idle
            self.waited += idle

    def reset(self) -> None:
        self.waited = 0.0
        self.forwards = self.verify_forwards = self.sampled = 0

    def forward(self, batch, args):
        start = time.thread_time()
        if args.late_bitmask is not None:
            args.token_bitmask = args.late_bitmask()
        rows, positions = (t.tolist() for t in batch.sample_loc)
        owner = {req.table_idx: req.uid for req in self.scheduler.reqs.values()
                 if req.table_idx >= 0}
        tokens = [self.script[owner[row]][pos] for row, pos in zip(rows, positions)]
        next_tokens = torch.tensor(tokens, dtype=torch.int64)
        engine = self.scheduler.engine
        engine.token_pool[batch.sample_loc] = next_tokens.to(torch.int32)
        self.forwards += 1
        self.verify_forwards += len(rows) > len(set(rows))
        self.sampled += len(rows)
        ForwardOutput, SampleOutput = self.types
        out = ForwardOutput(next_tokens, SampleOutput(next_tokens, None, None, None), None)
        self.skew -= time.thread_time() - start  # the stub is no part of the host's work
        self.free_at = max(self.now(), self.free_at) + self.device_s[len(rows) > 1]
        out.copy_done = Ready(self, self.free_at)
        return out


def run_decode(sched, device: SimDevice, prompts, script, params, profile: bool) -> dict:
    """Prefill every prompt, then time the decode phase to the end."""
    for uid, prompt in enumerate(prompts):
        sched.add_request(uid, prompt, params)
    tokens = 0
    started = set()
    while len(started) < len(prompts):
        for out in sched.step():
            started.add(out.uid)
            tokens += out.token is not None
    device.reset()
    profiler = cProfile.Profile() if profile else None
    start = device.now()
    if profiler is not None:
        profiler.enable()
    decode_tokens = 0
    while sched.has_work:
        decode_tokens += sum(out.token is not None for out in sched.step())
    if profiler is not None:
        profiler.disable()
    wall = device.now() - start
    n = max(device.forwards, 1)
    result = dict(forwards=device.forwards, verify=device.verify_forwards,
                  tokens=decode_tokens,
                  wall_ms=1e3 * wall / n,
                  host_ms=1e3 * (wall - device.waited) / n,
                  ms_per_token=1e3 * wall / max(decode_tokens, 1))
    if sched.spec is not None:  # the proposer's side
        result["spec"] = spec_counts(sched.spec.stats)
    if profiler is not None:
        result["profile"] = profiler
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", default=os.path.join(HERE, "..", ".."),
                        help="the checkout whose python/minisgl runs (default: this one)")
    parser.add_argument("--model", default=os.path.join(HERE, "..", "configs",
                                                        "smollm2-135m.json"))
    parser.add_argument("--batch", default="1,64")
    parser.add_argument("--methods", default="none,ngram,suffix")
    parser.add_argument("--device-ms", default="0/0,0.5/0.95",
                        help="simulated forward times (one row/more rows), comma-separated")
    parser.add_argument("--file-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--edit-every", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3, help="best of")
    parser.add_argument("--spec", default="{}", help="extra speculative_config keys (JSON)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(os.path.abspath(args.tree), "python"))
    torch.set_num_threads(1)

    from minisgl import LLM, SamplingParams
    from minisgl.engine.engine import ForwardOutput
    from minisgl.sampling import SampleOutput

    model = tiny_model(args.model)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print(f"tree {os.path.abspath(args.tree)}")
    print(f"{'method':>7} {'batch':>5} {'dev ms':>9} {'fwds':>5} {'verify':>6} {'tok/f':>5} "
          f"{'wall ms':>8} {'host ms':>8} {'ms/tok':>7}")
    for batch in map(int, args.batch.split(",")):
        prompts, script = workload(batch, args.file_len, args.max_tokens, args.edit_every,
                                   vocab, seed=batch)
        for method in args.methods.split(","):
            options = {}
            if method != "none":
                options["speculative_config"] = json.dumps({"method": method,
                                                            **json.loads(args.spec)})
            llm = LLM(model, dummy_weights=True, warmup="off", device="cpu", dtype="float32",
                      max_running_requests=max(batch, 8), **options)
            sched = llm.scheduler
            for device_ms in args.device_ms.split(","):
                one, more = (float(x) / 1e3 for x in device_ms.split("/"))
                profile = args.profile and more == 0
                device = SimDevice(sched, script, (one, more), ForwardOutput, SampleOutput)
                best = None
                for _ in range(args.repeats):
                    if sched.spec is not None:
                        sched.spec.reset()  # the suffix trie starts empty every run
                    r = run_decode(sched, device, prompts, script, params, profile)
                    if best is None or r["wall_ms"] * r["forwards"] < \
                            best["wall_ms"] * best["forwards"]:
                        best = r
                assert best is not None
                tok_v = best["tokens"] / best["forwards"]
                print(f"{method:>7} {batch:>5} {device_ms:>9} {best['forwards']:>5} "
                      f"{best['verify']:>6} {tok_v:>5.2f} {best['wall_ms']:>8.3f} "
                      f"{best['host_ms']:>8.3f} {best['ms_per_token']:>7.4f}"
                      + (f"  {best['spec']}" if "spec" in best else ""), flush=True)
                if "profile" in best:
                    stats = pstats.Stats(best["profile"])
                    stats.sort_stats("tottime").print_stats(args.top)
            llm.close()


if __name__ == "__main__":
    main()
