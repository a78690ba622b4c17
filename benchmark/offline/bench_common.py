"""What the benchmark scripts share: the GPU's name, a model directory (a bare config gets random
weights), the project's commit, environment variables for one variant, and ``StepTrace`` (where the
time of a run goes)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from minisgl import LLM  # noqa: E402


def gpu_name() -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return next((k for k in ("H100", "H200", "A100", "B200") if k in name), name)


def cuda_ms(fn, iters: int = 50) -> float:
    """Milliseconds per call of ``fn`` on the GPU: CUDA events around ``iters`` calls, after three
    untimed ones (compilation, autotuning)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def model_dir(model: str) -> tuple[str, bool]:
    """A directory for ``model``; a bare config.json is copied into a temp dir (dummy weights)."""
    if model.endswith(".json"):
        tmp = tempfile.mkdtemp(prefix="minisgl-bench-")
        shutil.copy(model, os.path.join(tmp, "config.json"))
        return tmp, True
    return model, False


def borrow_tokenizer(path: str) -> None:
    """Grammars need a tokenizer: a bare config (random weights) borrows the default model's. Its
    vocabulary is smaller than most models'; the ids past it are masked off, as padding is."""
    from minisgl.models.default_model import default_model_path

    source = default_model_path()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(source, name), os.path.join(path, name))
    print(f"--structured: the dummy model uses the tokenizer of {source}", flush=True)


@contextlib.contextmanager
def environment(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def project_commit() -> str:
    """The commit of this project's checkout, or "unknown". A copy of the tree without .git (e.g.
    on a lent GPU machine) passes MINISGL_COMMIT; git is asked about this file's own checkout, and
    only believed when that checkout's top is this project (an exported tree inside another
    repository must not record that repository's commit)."""
    if os.environ.get("MINISGL_COMMIT"):
        return os.environ["MINISGL_COMMIT"]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    top = git("rev-parse", "--show-toplevel")
    if not top or os.path.realpath(top) != os.path.realpath(root):
        return "unknown"
    return git("rev-parse", "--short", "HEAD") or "unknown"


class StepTrace:
    """Where the time of a run goes: the wall time of every scheduler step, by the batch it read
    back.

    A step launches batch N+1 and reads back batch N (overlap), so the time between two steps'
    returns is batch N's device time when the GPU is the bottleneck (else the host's time per step).
    Decode steps are also reported as bytes moved per second (weights + the KV of every request read
    once + a hybrid model's state of every request read and written), the quantity the bandwidth
    ceiling assumes.
    """

    def __init__(self, llm: LLM) -> None:
        sched = getattr(llm.scheduler, "inner", llm.scheduler)  # TP: rank 0's own scheduler
        self.rows: list[tuple[float, str, int, int]] = []  # (end time, phase, requests, KV tokens)
        self.overlap = sched.config.overlap
        engine = sched.engine
        self.weight_bytes = engine.weight_bytes
        self.kv_bytes_per_token = engine.kv_pool.mem_bytes / engine.kv_pool.num_slots
        # a hybrid model's recurrent state, read and written back by every decode row
        pool = engine.state_pool
        self.state_bytes_per_req = 2 * pool.bytes_per_slot if pool is not None else 0
        launch, step = sched._launch, sched.step
        launched: list[tuple[str, int, int]] = []  # (phase, requests, KV tokens) per launch

        def traced_launch(*args):
            res = launch(*args)
            if res is not None:
                batch = res.plan.batch
                launched.append((batch.phase, batch.size, sum(r.device_len for r in batch.feeds)))
            return res

        def traced_step():
            n, inflight = len(launched), sched._inflight is not None
            out = step()
            # the batch read back: the one launched by the previous step (overlap) or by this one
            done = ((n - 1 if inflight else None) if self.overlap
                    else (n if len(launched) > n else None))
            self.rows.append((time.perf_counter(),)
                             + (launched[done] if done is not None else ("idle", 0, 0)))
            return out

        sched._launch, sched.step = traced_launch, traced_step

    def start(self) -> None:
        self.rows.clear()
        self.t0 = time.perf_counter()

    def summary(self) -> dict:
        prev, acc = self.t0, {}
        decode_bytes = 0.0
        for end, phase, size, kv_tokens in self.rows:
            key = phase if phase != "decode" else f"decode_bs{_bucket(size)}"
            n, secs, toks = acc.get(key, (0, 0.0, 0))
            acc[key] = (n + 1, secs + end - prev, toks + size)
            if phase == "decode":
                decode_bytes += (self.weight_bytes + kv_tokens * self.kv_bytes_per_token
                                 + size * self.state_bytes_per_req)
            prev = end
        decode_s = sum(v[1] for k, v in acc.items() if k.startswith("decode"))
        return {
            "steps": {k: {"steps": n, "seconds": round(t, 3), "requests": toks}
                      for k, (n, t, toks) in sorted(acc.items())},
            "decode_seconds": round(decode_s, 3),
            "decode_tb_per_s": round(decode_bytes / decode_s / 1e12, 3) if decode_s else None,
        }


def _bucket(size: int) -> str:
    for lo, hi in ((1, 15), (16, 63), (64, 191), (192, 256)):
        if size <= hi:
            return f"{lo}-{hi}"
    return "257+"
