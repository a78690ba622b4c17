"""How ``bench_images.py`` times chats with an image, the same way for both engines: the vision
tower's forward calls from hooks (``TowerClock``), every chat queued at once on minisgl's
scheduler with each one's time to its first token (``serve``), and the figures both engines
report from the single chats and the batch (``summary``)."""

from __future__ import annotations

import itertools
import statistics
import time

import torch

from minisgl import LLM, SamplingParams

_UIDS = itertools.count(1 << 50)


class TowerClock:
    """The time a vision tower's forward calls take, from forward hooks (CUDA events on the
    GPU, the host clock on the CPU): the engine calls the tower as it always does."""

    def __init__(self, module: torch.nn.Module, cuda: bool) -> None:
        self.cuda, self.spans, self._open = cuda, [], None
        module.register_forward_pre_hook(lambda *_: setattr(self, "_open", self._mark()))
        module.register_forward_hook(lambda *_: self.spans.append((self._open, self._mark())))

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def take_ms(self) -> float:
        """Milliseconds in the tower since the last call."""
        if self.cuda:
            torch.cuda.synchronize()
        ms = sum(a.elapsed_time(b) if self.cuda else 1000 * (b - a) for a, b in self.spans)
        self.spans.clear()
        return ms


def serve(llm: LLM, prompts: list, max_tokens: int) -> dict:
    """Queue every prompt at once and step until all finish: seconds, output tokens and each
    request's time to its first token (seconds from the start)."""
    sched = llm.scheduler
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    left = set()
    for prompt in prompts:
        uid = next(_UIDS)
        sched.add_request(uid, list(prompt.input_ids), params, prompt)
        left.add(uid)
    first, tokens = {}, 0
    while left:  # NOTE: a token comes back once its step is read back (the device is done)
        for tok in sched.step():
            if tok.uid in left:
                first.setdefault(tok.uid, time.perf_counter() - start)
                tokens += tok.token is not None
                if tok.finish_reason is not None:
                    left.discard(tok.uid)
    sched.drain()
    return {"seconds": time.perf_counter() - start, "output_tokens": tokens,
            "ttft_s": sorted(first.values())}


def summary(runs: list[tuple[float, float, float]], batch: dict, batch_encoder_ms: float) -> dict:
    """``runs``: (TTFT, tower, preprocessing) milliseconds of each single chat."""
    ttft, enc, prep = (statistics.median(r[i] for r in runs) for i in range(3))
    times = batch["ttft_s"]
    pct = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return {"ttft_ms": round(ttft, 2), "ttft_ms_runs": [round(r[0], 2) for r in runs],
            "encoder_ms": round(enc, 2), "encoder_share": round(enc / ttft, 3),
            "preprocess_ms": round(prep, 2), "batch_seconds": round(batch["seconds"], 3),
            "output_tokens": batch["output_tokens"],
            "output_tok_per_s": round(batch["output_tokens"] / batch["seconds"], 1),
            "batch_ttft_s": {"p50": round(pct(0.5), 3), "p90": round(pct(0.9), 3),
                             "max": round(times[-1], 3)},
            "batch_encoder_s": round(batch_encoder_ms / 1000, 3)}
