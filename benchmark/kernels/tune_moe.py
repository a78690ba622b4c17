"""Tune the fused MoE's tiles for this GPU: per token count, every candidate configuration timed
(CUDA-graph medians, L2 flushed, ``bench_moe.graph_ms``), the fastest kept per bucket of rows per
expert, written where ``pick_config`` reads it (``minisgl/kernel/triton/moe_configs``).

    python benchmark/kernels/tune_moe.py [--mxfp4 [--layout words|fragments|gluon] | --shape NAME]
        [--budget 180] [--write] [--tokens T ...] [--shortlist] [--out DIR]

``--mxfp4``: gpt-oss's MXFP4 experts (2I = 5760, H = 2880; the file serves gpt-oss-20b and -120b,
which differ in their expert count alone); else bf16 experts of ``--shape`` (Qwen3-30B-A3B's by
default, ``gemma-4-26b-a4b`` Gemma 4's; a table is keyed by 2I and H). Candidates whose
output differs from the default configuration's by more than bf16 rounding, or that do not
compile, are reported and left out. ``--tokens`` tunes a few token counts only: their buckets
replace those of the same counts in the shipped table, whose other buckets are kept (as they are
for the counts a ``--budget`` that runs out never finishes: they are tuned in the order given,
the most wanted first). ``--shortlist`` times only the tiles some GPU's shipped table of the
same format and shape picks within a factor of four of each count (a sibling chip's winners
on a new one, in a minute or two of device time). ``--layout fragments``: the experts in
the fragment layout (``--moe-backend triton_fragments``), its GEMV and Triton tiles; ``gluon``:
those and the Gluon kernel's (``triton_fragments_gluon``); each its own table, which
``moe_mxfp4_frag.frag_tile`` reads before its built-in one (``benchmark/kernels/
bench_moe_fragments.py``'s candidates).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import bench_moe
import bench_moe_fragments
import torch
from bench_moe import graph_ms, inputs

import minisgl.kernel.triton.fused_moe as fused_moe_module
from minisgl.kernel.moe_types import FragmentScales, GluonFragmentScales
from minisgl.kernel.triton.fused_moe import MoeConfig, fused_moe, pick_config
from minisgl.kernel.triton.moe_configs import DIR, file_name

# (block_m, block_n1, block_n2, block_k, group_m, num_warps, num_stages[, swapped[, maxnreg]]);
# MXFP4 runs blocks of one row on its GEMV kernel, up to 32 rows on its small-batch kernel,
# larger ones on the wide (swapped) one, and 16 or 32 there too where ``swapped`` says so
SMALL = [(16, 32, 64, 256, 1, 4, 3), (16, 64, 64, 256, 1, 4, 3), (16, 64, 64, 128, 1, 4, 4),
         (16, 32, 32, 256, 1, 4, 3), (16, 64, 32, 128, 1, 4, 4)]
# MXFP4: one routed pair a block; the word-reading GEMV loads its next K step's
# BLOCK_N x BLOCK_K / 8 words while it decodes this one's, so small steps and programs of one or
# two warps are candidates (1,024-deep steps spill on sm_90 with the second step in registers)
GEMV = [(1, 16, 16, 256, 1, 4, 3), (1, 32, 32, 256, 1, 4, 3), (1, 16, 16, 512, 1, 4, 2),
        (1, 8, 8, 512, 1, 2, 2), (1, 32, 32, 128, 1, 8, 3), (1, 8, 8, 128, 1, 1, 3),
        (1, 4, 4, 256, 1, 1, 3), (1, 8, 8, 256, 1, 1, 3), (1, 16, 16, 256, 1, 2, 3),
        (1, 8, 8, 256, 1, 2, 3), (1, 16, 16, 128, 1, 2, 3)]
# MXFP4 from one token: the swapped kernel decodes each weight once a row block, as the GEMV
# does, but in PTX, and leaves the multiply-adds to the tensor cores
SWAPPED = [(16, 64, 64, 128, 1, 4, 3, True), (16, 128, 128, 64, 1, 4, 4, True),
           (16, 128, 128, 128, 1, 4, 3, True), (32, 128, 128, 64, 4, 4, 4, True),
           (32, 64, 64, 128, 4, 4, 3, True), (16, 64, 64, 256, 1, 4, 3, True),
           # 8 warps: fewer registers a thread (32 x 128 x 64: 98 against 155 on sm_90 with
           # Triton 3.6), so more warps an SM where the 4-warp tiles issue every second cycle
           (32, 128, 128, 64, 4, 8, 4, True), (32, 128, 128, 128, 4, 8, 3, True),
           (16, 128, 128, 64, 1, 8, 4, True),
           # the word layout's 2.9 instructions a weight leave room for wider and deeper steps
           # (sm_90: 126, 165 and 94 registers)
           (16, 256, 256, 64, 1, 8, 4, True), (32, 256, 256, 64, 4, 8, 3, True),
           (16, 128, 128, 128, 1, 8, 3, True),
           # registers capped (sass_moe, sm_90) for one more program an SM: 16 x 128 on 8 warps
           # 73 -> 64 (3 -> 4 programs, no spill), 32 x 128 on 8 warps 95 -> 80 (2 -> 3, 24 bytes
           # of stack), on 4 warps 164 -> 128 (3 -> 4, 18 local loads and stores a K step)
           (16, 128, 128, 64, 1, 8, 4, True, 64), (32, 128, 128, 64, 4, 8, 4, True, 80),
           (32, 128, 128, 64, 4, 4, 4, True, 128),
           # one more program still, with a spill (the 80-register cap won at 128 tokens on the
           # H200, the 4-warp 128 lost): 32 x 128 on 8 warps at 64 (4 programs; 3.7 -> 4.4
           # instructions a weight, 17 local loads a K step), 16 x 128 at 48 (5; 3.7 -> 4.6)
           (32, 128, 128, 64, 4, 8, 4, True, 64), (16, 128, 128, 64, 1, 8, 4, True, 48)]
# and with a few tokens, narrow tiles: 4 experts' 2,880 columns make 180 programs of 64, 720
# of 16 (tiles whose gated K step spills on sm_90 left out: 16 x 256 on one warp, 32 x 256)
NARROW = [(16, 16, 16, 128, 1, 1, 3, True), (16, 16, 16, 128, 1, 2, 3, True),
          (16, 32, 32, 128, 1, 2, 3, True), (16, 64, 64, 64, 1, 4, 4, True)]
MID = [(16, 64, 64, 256, 1, 4, 3), (32, 64, 64, 128, 4, 4, 4), (32, 64, 64, 256, 4, 4, 3),
       (32, 128, 128, 128, 4, 4, 3), (64, 128, 128, 64, 8, 4, 4), (64, 128, 128, 128, 8, 4, 3),
       (64, 128, 128, 64, 8, 8, 4)]
BIG = [(64, 128, 128, 64, 8, 4, 4), (128, 128, 128, 64, 8, 8, 4), (128, 128, 128, 128, 8, 8, 3),
       (64, 128, 128, 64, 8, 4, 3), (128, 128, 128, 64, 4, 8, 4), (128, 128, 256, 64, 8, 8, 3)]
# rows per expert T * K / E: gpt-oss's 1/8 .. 1,024; 8,192 tokens: an offline mixed step (the
# default max_prefill_tokens), whose tiles the last bucket serves
TOKENS = [1, 4, 16, 64, 128, 256, 512, 1024, 4096, 8192]
# bf16 experts: hidden, moe_intermediate, experts, top-k
SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8), "gemma-4-26b-a4b": (2816, 704, 128, 8)}


def candidates(rows: float, mx: bool, layout: str = "words") -> list[MoeConfig]:
    if layout != "words":  # the fragment layout's (and the Gluon kernel's)
        return [MoeConfig(*c) for c in bench_moe_fragments.candidates(rows) + (
            bench_moe_fragments.candidates(rows, gluon_only=True) if layout == "gluon" else [])]
    table = (SMALL + (GEMV if mx and rows <= 1 else []) if rows <= 4 else MID if rows <= 64
             else BIG)
    if mx and rows <= 64:
        table = table + SWAPPED + (NARROW if rows <= 4 else [])
    return [MoeConfig(*c) for c in table]


def shortlist(tokens: int, fmt: str, n: int, k: int) -> list[MoeConfig]:
    """The tiles that any GPU's shipped table of this format and shape picks for a count within
    a factor of four of ``tokens``, each once: what won on a sibling chip, timed on this one."""
    paths = sorted(DIR.glob("*" + file_name("", fmt, n, k)))
    return list(dict.fromkeys(  # MoeConfig is frozen: equal tiles hash alike, the first kept
        MoeConfig(*b["config"]) for path in paths for b in json.loads(path.read_text())["buckets"]
        if tokens / 4 <= b["tokens"] <= tokens * 4))


def in_layout(args: tuple, kw: dict, layout: str) -> tuple[tuple, dict]:
    """``inputs``' MXFP4 experts in ``layout``: as they are (``words``), or in the fragment
    layout with the scales that pick its Triton tiles or (``gluon``) the Gluon kernel's too."""
    if layout == "words":
        return args, kw
    x, w13, w2, weights, ids = args
    f13, f2, t13, t2 = bench_moe_fragments.fragment_experts(w13, w2, kw["scales"])
    kind = GluonFragmentScales if layout == "gluon" else FragmentScales
    return (x, f13, f2, weights, ids), dict(kw, scales=kind(t13, t2))


def main() -> int | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mxfp4", action="store_true")
    p.add_argument("--layout", choices=["words", "fragments", "gluon"], default="words",
                   help="with --mxfp4: the experts' layout, and so the kernels tuned")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-30b-a3b",
                   help="whose bf16 experts (without --mxfp4)")
    p.add_argument("--budget", type=float, default=180.0, help="seconds for the whole run")
    p.add_argument("--write", action="store_true", help="into the package's moe_configs")
    p.add_argument("--unpermuted", action="store_true",
                   help="the swapped kernel's tiles in K order (to compare)")
    p.add_argument("--tokens", type=int, nargs="+", default=TOKENS,
                   help="token counts to tune (others keep the shipped table's buckets)")
    p.add_argument("--no-ws", action="store_true",
                   help="--layout gluon without the warp-specialized tiles (to compare)")
    p.add_argument("--shortlist", action="store_true",
                   help="time only the tiles the shipped tables (every GPU's) pick at a quarter "
                        "to four times each count: a new GPU's table in a minute or two")
    p.add_argument("--out", default="bench-out")
    a = p.parse_args()
    if a.layout != "words" and not a.mxfp4:
        p.error("--layout fragments|gluon tunes MXFP4 experts: add --mxfp4")
    if a.unpermuted:
        fused_moe_module.PERMUTE = False
    h, inter, e, k = (2880, 2880, 32, 4) if a.mxfp4 else SHAPES[a.shape]
    bench_moe.H, bench_moe.INTER, bench_moe.E, bench_moe.K = h, inter, e, k
    deadline = time.time() + a.budget
    fmt = ("mxfp4" if a.layout == "words" else f"mxfp4_{a.layout}") if a.mxfp4 else "bf16"
    best = []
    for tokens in a.tokens:  # in the order given: a budget that runs out cuts the last ones
        args, kw = inputs(tokens, mx=a.mxfp4)
        rows = tokens * k / e
        ref = fused_moe(*args, config=pick_config(tokens * k, e, a.mxfp4), **kw).float()
        args, kw = in_layout(args, kw, a.layout)
        timed, cut = [], False
        tiles = (shortlist(tokens, fmt, 2 * inter, h) if a.shortlist
                 else candidates(rows, a.mxfp4, a.layout))
        for cfg in tiles:
            if a.no_ws and cfg.gluon_ws:
                continue
            if time.time() > deadline:
                cut = True
                break
            try:
                out = fused_moe(*args, config=cfg, **kw).float()
            except Exception as exc:  # a variant this GPU's compiler refuses: reported, not kept
                print(f"rejected {tuple(cfg.__dict__.values())}: {type(exc).__name__}: {exc}"[:400])
                continue
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            if err >= 2e-2:  # more than a few bf16 roundings of the largest output: wrong
                print(f"rejected {tuple(cfg.__dict__.values())}: max error {err:.3g}")
                continue
            timed.append((graph_ms(lambda: fused_moe(*args, config=cfg, **kw)) * 1e3, cfg))
        if cut or not timed:  # this count and the later ones keep their shipped buckets
            print(f"{'the budget ran out' if cut else 'no candidate ran'} at {tokens} tokens")
            break
        us, cfg = min(timed, key=lambda t: t[0])
        best.append(dict(tokens=tokens, rows=rows, us=round(us, 1),
                         config=list(cfg.__dict__.values()),
                         timed={str(tuple(c.__dict__.values())): round(t, 1) for t, c in timed}))
        print(json.dumps(best[-1]), flush=True)
    gpu = torch.cuda.get_device_name()
    name = file_name(gpu, fmt, 2 * inter, h)
    tuned = {b["tokens"] for b in best}
    if not tuned:
        print("nothing tuned: no table written")
        return 1
    partial = sorted(tuned) != TOKENS
    if partial and (DIR / name).exists():  # the shipped table's other buckets
        with open(DIR / name) as f:
            kept = [b for b in json.load(f)["buckets"] if b["tokens"] not in tuned]
        best = best + [dict(b, rows=b["tokens"] * k / e) for b in kept]
    best = sorted(best, key=lambda b: b["tokens"])
    for lo, hi in zip(best, best[1:]):  # a bucket reaches the geometric mean of two tuned counts
        lo["max_rows"] = (lo["rows"] * hi["rows"]) ** 0.5
    # and the last bucket all beyond, where the last count was tuned; else up to the next count
    # (beyond it the caller's rule: a budget cut short leaves the largest batches to it)
    untuned = [t * k / e for t in TOKENS if t > best[-1]["tokens"]]
    best[-1]["max_rows"] = (best[-1]["rows"] * untuned[0]) ** 0.5 if untuned else 1e9
    doc = dict(gpu=gpu, torch=torch.__version__, experts=e, top_k=k,
               command="python benchmark/kernels/tune_moe.py"
               + (" --mxfp4" + (f" --layout {a.layout}" if a.layout != "words" else "")
                  if a.mxfp4 else f" --shape {a.shape}")
               + (" --shortlist" if a.shortlist else "")
               + (f" --tokens {' '.join(map(str, sorted(tuned)))} (over the last table)"
                  if partial else ""),
               buckets=[dict(max_rows=b["max_rows"], config=b["config"], tokens=b["tokens"],
                             us=b["us"]) for b in best])
    os.makedirs(a.out, exist_ok=True)
    for path in [os.path.join(a.out, name)] + ([str(DIR / name)] if a.write else []):
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote", path)
    with open(os.path.join(a.out, name.replace(".json", "_timed.json")), "w") as f:
        json.dump(best, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
