"""The host work of structured output per decode step: the grammar masks of a batch and the
accept of its tokens, as ``benchmark/offline/bench.py --structured`` has it (``LONG_JSON`` on every
other request, Qwen's 151,936-wide logits, the default model's 49,152-token tokenizer).

    python benchmark/kernels/bench_grammar.py [--batch 256] [--steps 32] [--threads N] [--out DIR]

Two paths over the same tokens (each step every constrained row takes a random allowed token,
seed 0; the masks of the two paths are checked equal):

- ``per-row`` (before): xgrammar's vocabulary as wide as the logits, a fresh all-ones mask each
  step, ``fill_next_token_bitmask`` row by row, the copy, ``accept_token`` matcher by matcher.
- ``batched`` (now, ``scheduler/grammar.py`` + ``structured/``): ``BatchMasks.fill`` (xgrammar's
  ``BatchGrammarMatcher`` on ``--threads`` threads, the tokenizer's width, a reused buffer),
  ``to_device`` (on CUDA a pinned async copy, widened on the device), ``batch_accept_token``.

Without CUDA the copy is a host memcpy of the same bytes (per-row) or the widening ``torch.cat``
(batched). Writes JSON and markdown named ``<date>_grammar_<gpu or cpuN>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import gpu_name  # noqa: E402
from bench_runs import LONG_JSON  # noqa: E402

from minisgl.models.default_model import default_model_path  # noqa: E402
from minisgl.structured import BatchMasks, GrammarCompiler, fill_threads, new_bitmask  # noqa: E402
from minisgl.utils import usable_cpus  # noqa: E402
from minisgl.utils.hf import load_tokenizer  # noqa: E402

VOCAB = 151_936


def per_row_step(matchers, rows, batch, device):
    """The old GrammarManager.bitmask: returns the mask and the times of its phases (s)."""
    t0 = time.perf_counter()
    mask = new_bitmask(batch, VOCAB)
    t1 = time.perf_counter()
    for i, m in zip(rows, matchers):
        m.fill_next_token_bitmask(mask, i)
    t2 = time.perf_counter()
    out = mask.to(device, non_blocking=True) if device.type == "cuda" else mask.clone()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t3 = time.perf_counter()
    return out, {"alloc": t1 - t0, "fill": t2 - t1, "copy": t3 - t2}


def batched_step(masks, matchers, device):
    t0 = time.perf_counter()
    host = masks.fill(matchers)
    t1 = time.perf_counter()
    out = masks.to_device(host, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return out, {"alloc": 0.0, "fill": t1 - t0, "copy": t2 - t1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256, help="rows; every other is constrained")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="fill threads (default: auto)")
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    args = parser.parse_args()
    import xgrammar as xgr

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(default_model_path())
    compiler = GrammarCompiler(tokenizer, VOCAB, stop_token_ids=(tokenizer.eos_token_id,))
    compiled = compiler.compile("json_schema", LONG_JSON)
    rows = list(range(0, args.batch, 2))
    new = [compiler.matcher(compiled) for _ in rows]
    masks = BatchMasks(compiler, args.threads)
    wide = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=VOCAB, stop_token_ids=[tokenizer.eos_token_id]))
    wide_grammar = wide.compile_grammar(xgr.Grammar.from_json_schema(LONG_JSON,
                                                                     any_whitespace=False))
    old = [xgr.GrammarMatcher(wide_grammar) for _ in rows]
    batch_rows: list = [None] * args.batch
    for i, m in zip(rows, new):
        batch_rows[i] = m
    rng = np.random.default_rng(0)
    times = {"per-row": [], "batched": []}
    for step in range(args.warmup + args.steps):
        a, ta = per_row_step(old, rows, args.batch, device)
        b, tb = batched_step(masks, batch_rows, device)
        assert torch.equal(a.cpu()[rows], b.cpu()[rows]), step  # the same allowed tokens
        bits = np.unpackbits(b.cpu()[rows].numpy().view(np.uint8), axis=1, bitorder="little")
        tokens = [int(rng.choice(np.flatnonzero(r))) for r in bits]
        t0 = time.perf_counter()
        ok_old = [m.accept_token(t) for m, t in zip(old, tokens)]
        t1 = time.perf_counter()
        ok_new = BatchMasks.accept(new, tokens)
        t2 = time.perf_counter()
        assert all(ok_old) and all(ok_new)
        ta["accept"], tb["accept"] = t1 - t0, t2 - t1
        if step >= args.warmup:
            times["per-row"].append(ta)
            times["batched"].append(tb)
    n = len(rows)
    result = []
    for path, steps in times.items():
        ms = {k: float(np.median([s[k] for s in steps])) * 1e3 for k in steps[0]}
        ms["total"] = sum(ms.values())
        result.append({"path": path, "rows": args.batch, "constrained": n,
                       **{f"{k}_ms": round(v, 3) for k, v in ms.items()},
                       "total_us_per_constrained_row": round(ms["total"] / n * 1e3, 2)})
        print(json.dumps(result[-1]), flush=True)
    speedup = result[0]["total_ms"] / result[1]["total_ms"]
    cpus = usable_cpus()
    where = gpu_name() if device.type == "cuda" else f"cpu{cpus}"
    date = datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{date}_grammar_{where}")
    info = {"device": where, "cpus": cpus, "threads": masks.threads, "date": date,
            "commit": os.environ.get("MINISGL_COMMIT", "unknown"), "vocab": VOCAB,
            "tokenizer_vocab": len(tokenizer), "steps": args.steps, "rows": result,
            "speedup": round(speedup, 1)}
    with open(stem + ".json", "w") as f:
        json.dump(info, f, indent=1)
    lines = [f"Grammar host work per decode step on {where} ({cpus} CPUs, {masks.threads} fill "
             f"threads, {date}): {args.batch} rows, {n} constrained by LONG_JSON, logits "
             f"{VOCAB} wide, tokenizer {len(tokenizer)}; median ms over {args.steps} steps.", "",
             "| path | alloc | fill | copy | accept | total | us per constrained row |",
             "|---|---|---|---|---|---|---|"]
    for r in result:
        lines.append(f"| {r['path']} | {r['alloc_ms']} | {r['fill_ms']} | {r['copy_ms']} | "
                     f"{r['accept_ms']} | {r['total_ms']} | {r['total_us_per_constrained_row']} |")
    lines += ["", f"batched is {speedup:.1f}x faster (auto fill threads here: {fill_threads()})."]
    if device.type != "cuda":
        lines += ["", "No CUDA: copy is a host copy of the mask (per-row) or the numpy widening to "
                  "the logits' words (batched); on a GPU it is the copy to the device."]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
