"""How many long requests run at once under a fixed KV budget, with the sliding-window layers'
pages freed past the window (``--sliding-pool-ratio``: the default's sizing, ``auto``, and a ratio
worked out by hand) and without (one pool for all layers)::

    python benchmark/offline/sliding_window_memory.py --model benchmark/configs/gemma-3-27b-it.json

The model is the config's layer pattern (Gemma 3 27B: 62 layers, 52 sliding of window 1024 and
10 global) with every layer's KV shrunk alike (one KV head of 16; the hidden size too), so the
pool fits in a CPU's memory while the ratio of full to windowed KV is the real model's: all its
layers have the same KV shape. The vision tower is left out (text requests only). The budget is
given in full-length requests' worth of KV without freeing (``--budget-requests``). The
scheduler, cache manager and pools are the real ones; the model forward is replaced by a stub
that returns token 0 (the question is memory, not speed).

Reported: the most requests holding KV at once, and their mean in the steady state (after the
first request finished, while others still wait for room), for each layout, and the ideal ratio
``layers / (full + sliding * window / length)``; and what ``auto`` chooses at the default
``--max-running-requests`` (256).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import tempfile

import bench_common  # noqa: F401  (puts python/ on the path)
import torch

from minisgl import LLM, SamplingParams
from minisgl.engine.engine import ForwardOutput
from minisgl.engine.pool_sizes import size_pools

SHRINK = dict(hidden_size=64, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
              head_dim=16, vocab_size=512)


def shrunk_model(config: str) -> tuple[str, dict]:
    with open(config) as f:
        raw = json.load(f)
    text = raw.get("text_config", raw)
    text.update(SHRINK)
    # the text layers alone: a checkpoint that takes images keeps one pool under ``auto``
    raw.pop("vision_config", None)
    tmp = tempfile.mkdtemp(prefix="minisgl-swa-")
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(raw, f)
    return tmp, text


def stub_forward(batch, args) -> ForwardOutput:
    n = sum(feed.samples for feed in batch.feeds)
    return ForwardOutput(torch.zeros(n, dtype=torch.int64), None, None)  # type: ignore[arg-type]


def run(path: str, prompts, params, ratio: float | str, budget_gb: float, args) -> dict:
    llm = LLM(path, dummy_weights=True, device="cpu", dtype="float32", page_size=args.page_size,
              kv_cache_memory_gb=budget_gb, max_prefill_tokens=args.chunk,
              max_seq_len=args.length, cache="naive", sliding_pool_ratio=ratio,
              max_running_requests=args.requests)
    sched = llm.scheduler
    engine = sched.engine
    engine.prepare = lambda batch: None
    engine.forward = stub_forward
    held, steady, decoding = [], [], []
    total = len(prompts)

    def counting(drafter=None):
        plan = schedule(drafter)
        n = len(sched.decode.running) + len(sched.prefill.admitted())
        held.append(n)
        # steady state: some request has finished and others still wait for room
        finished = total - len(sched.reqs)
        if finished and any(r.table_idx < 0 for r in sched.prefill.waiting):
            steady.append(n)
            decoding.append(len(sched.decode.running))
        return plan

    schedule = sched.planner.plan
    sched.planner.plan = counting
    llm.generate(prompts, params)
    sched.check_integrity()
    # what ``auto`` picks for this budget, here and with the default limit of running requests
    why = [size_pools(engine.cache_spec, dataclasses.replace(
        engine.config, sliding_pool_ratio=None, max_running_reqs=n), engine.max_seq_len,
        budget_gb * (1 << 30), True).why for n in (args.requests, 256)]
    return dict(sliding_pool_ratio=ratio, full_pages=engine.num_pages, auto_why=why[0],
                default_why=why[1],
                window_pages=engine.window_pages, page_size=args.page_size,
                peak_requests=max(held),
                steady_requests=sum(steady) / len(steady) if steady else None,
                steady_decoding=sum(decoding) / len(decoding) if decoding else None,
                retractions=sched.num_retractions, steps=len(held))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="benchmark/configs/gemma-3-27b-it.json")
    parser.add_argument("--length", type=int, default=32768, help="tokens of a request, all in")
    parser.add_argument("--output-tokens", type=int, default=1024,
                        help="long enough that memory, not prefill, bounds the running set")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--budget-requests", type=int, default=4,
                        help="the KV budget, in full-length requests of KV without freeing")
    parser.add_argument("--chunk", type=int, default=1024, help="--max-prefill-tokens")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--ratio", type=float, default=None,
                        help="--sliding-pool-ratio (default: (window + chunk + 2 pages) / length)")
    parser.add_argument("--out", default=None, help="write the result here (.json and .md)")
    args = parser.parse_args()
    path, text = shrunk_model(args.model)
    try:
        types = text.get("layer_types") or [
            "sliding_attention" if (i + 1) % text.get("sliding_window_pattern", 6) else
            "full_attention" for i in range(text["num_hidden_layers"])]
        n_slide = types.count("sliding_attention")
        n_full, window = len(types) - n_slide, text["sliding_window"]
        layer_bytes = 2 * SHRINK["num_key_value_heads"] * SHRINK["head_dim"] * 4  # float32
        budget = args.budget_requests * args.length * len(types) * layer_bytes
        budget_gb = budget / (1 << 30) + 1e-6
        ratio = args.ratio or (window + args.chunk + 2 * args.page_size) / args.length
        rng = random.Random(0)
        prompt_len = args.length - args.output_tokens
        prompts = [[rng.randint(10, 500) for _ in range(prompt_len)]
                   for _ in range(args.requests)]
        params = SamplingParams(temperature=0, max_tokens=args.output_tokens, ignore_eos=True)
        result = dict(
            model=args.model, layers=len(types), sliding_layers=n_slide, window=window,
            request_tokens=args.length, requests=args.requests, chunk=args.chunk,
            budget_requests=args.budget_requests,
            ideal_ratio=len(types) / (n_full + n_slide * min(window, args.length) / args.length),
            one_pool=run(path, prompts, params, 0.0, budget_gb, args),
            freed=run(path, prompts, params, ratio, budget_gb, args),
            auto=run(path, prompts, params, "auto", budget_gb, args),
        )
    finally:
        shutil.rmtree(path, ignore_errors=True)
    one = result["one_pool"]
    for name in ("freed", "auto"):
        d = result[name]
        d["holding_ratio"] = d["steady_requests"] / one["steady_requests"]
        d["decoding_ratio"] = d["steady_decoding"] / one["steady_decoding"]
        # full-length requests whose KV the pools hold (the sliding pool has room for them too)
        d["capacity_ratio"] = d["full_pages"] / one["full_pages"]
    text_out = json.dumps(result, indent=2)
    print(text_out)
    if args.out:
        with open(args.out + ".json", "w") as f:
            f.write(text_out + "\n")
        with open(args.out + ".md", "w") as f:
            f.write(report(result, args))


def table(r: dict) -> str:
    head = ["layout", "full pages", "sliding pages", "most requests holding KV",
            "holding KV, steady", "decoding, steady", "retractions"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, d in (("one pool (`--sliding-pool-ratio 0`)", r["one_pool"]),
                    (f"sliding pool, a ratio by hand (`--sliding-pool-ratio "
                     f"{r['freed']['sliding_pool_ratio']:.4f}`)", r["freed"]),
                    ("sliding pool, the default (`--sliding-pool-ratio auto`)", r["auto"])):
        cells = [name, d["full_pages"], d["window_pages"] or "(shared)", d["peak_requests"],
                 f"{d['steady_requests']:.2f}", f"{d['steady_decoding']:.2f}", d["retractions"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def report(r: dict, args) -> str:
    one, freed, auto = r["one_pool"], r["freed"], r["auto"]
    return f"""# Sliding-window pages freed: long requests at once (CPU, stub forward)

Command: `python benchmark/offline/sliding_window_memory.py --out
benchmark/results/cpu/sliding_window_memory` (defaults: {r['requests']} requests of
{r['request_tokens']} tokens, {args.output_tokens} of them generated, prefill chunks of
{r['chunk']}, pages of {args.page_size}, `--max-running-requests {r['requests']}`).

Layer pattern of `{r['model']}`: {r['layers']} layers, {r['sliding_layers']} sliding (window
{r['window']}), every layer's KV shrunk alike; a KV budget of {r['budget_requests']} full-length
requests without freeing. Real scheduler, cache manager and pools; the forward is a stub.
"Steady": averaged over the steps after the first request finished while others still waited
for room; "holding KV" counts requests being prefilled too (one of them may be retracted again
when decode runs short), "decoding" the requests that generate.

{table(r)}

Measured, against one pool: the default holds **{auto['holding_ratio']:.2f}x** the requests
holding KV at once in the steady state ({auto['decoding_ratio']:.2f}x the requests decoding: with
one pool the admission of a fifth request that does not fit thrashes, {one['retractions']}
retractions), and its pools hold {auto['capacity_ratio']:.2f}x the full-length requests; the
ratio worked out by hand, {freed['holding_ratio']:.2f}x holding KV and
{freed['decoding_ratio']:.2f}x decoding ({freed['capacity_ratio']:.2f}x the full-length
requests). Ideal (the ratio of full to windowed KV of one request,
`layers / (full + sliding * window / length)`): {r['ideal_ratio']:.2f}x. The gap: the sliding pool
holds a window plus two pages for every request that may run (`auto`, `engine/pool_sizes.py`) or
a window plus a prefill chunk per request (the ratio {freed['sliding_pool_ratio']:.4f}, not
{r['window'] / r['request_tokens']:.4f}), and page rounding.

What `auto` chose here: {auto['auto_why'].removeprefix('auto: ')}. At the default
`--max-running-requests` (256) and the same budget: {auto['default_why'].removeprefix('auto: ')}
(256 windows of 1024 tokens are more than one pool holds), so a long-context deployment of this
size sets `--max-running-requests` near what its memory holds.
"""


if __name__ == "__main__":
    main()
