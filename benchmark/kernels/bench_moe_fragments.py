"""gpt-oss-20b's fused MXFP4 MoE over the fragment layout (``quant.mxfp4_fragments``, the
``moe_mxfp4_frag`` GEMM) against the shipped word-layout kernels (this GPU's table), the same
weights, routing and biases, each replayed from a CUDA graph (median of ``do_bench``).

    python benchmark/kernels/bench_moe_fragments.py [--tokens 1 4 16 64 128 256 512] [--out DIR]
        [--gluon | --gluon-only] [--profile [--config FIELDS] | --kernels]

Per token count: the shipped table's time, then each fragment tile (``MoeConfig``'s fields; the
GEMV up to one row an expert), the best, and the ratio of the shipped time to it; the outputs of
the two layouts compared (largest difference over the largest value). Writes
``moe_fragments_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

import bench_moe  # noqa: E402
import torch  # noqa: E402
from bench_common import project_commit  # noqa: E402
from bench_moe import config, graph_ms, inputs  # noqa: E402

from minisgl.kernel.moe_types import FragmentScales, GluonFragmentScales  # noqa: E402
from minisgl.kernel.triton.fused_moe import MoeConfig, fused_moe  # noqa: E402
from minisgl.quant.mxfp4 import from_words  # noqa: E402
from minisgl.quant.mxfp4_fragments import to_fragments  # noqa: E402

# ``MoeConfig``'s fields: the GEMV (row blocks of one; block_k its step: 512-1,024 deep, a
# program's chain of dependent K steps three to six long where 256 makes it eleven), then wgmma
# tiles (16 or 32 rows, K steps of 64, num_warps = block_n / 16)
GEMV = [(1, 16, 16, 64, 1, 1, 2), (1, 16, 16, 128, 1, 1, 2), (1, 16, 16, 256, 1, 2, 2),
        (1, 32, 32, 128, 1, 2, 2), (1, 16, 16, 128, 1, 2, 2), (1, 16, 16, 256, 1, 1, 2),
        (1, 32, 32, 256, 1, 2, 2), (1, 16, 16, 512, 1, 2, 2), (1, 16, 16, 512, 1, 4, 2),
        (1, 32, 32, 512, 1, 4, 2), (1, 16, 16, 1024, 1, 4, 2), (1, 16, 16, 1024, 1, 8, 2)]
TILES = [(16, 128, 128, 64, 1, 8, 4, True), (16, 128, 128, 64, 1, 8, 4, True, 64),
         (16, 64, 64, 64, 1, 4, 4, True), (32, 128, 128, 64, 4, 8, 4, True, 80),
         (32, 128, 128, 64, 4, 8, 3, True), (32, 64, 64, 64, 4, 4, 4, True),
         # from 64 rows two stages (three raced on the H200: a few wrong outputs a call)
         (64, 128, 128, 64, 4, 8, 2, True), (64, 64, 64, 64, 4, 4, 2, True),
         (128, 64, 64, 64, 8, 4, 2, True), (128, 128, 128, 64, 8, 8, 2, True)]
# ``--gluon``: the Gluon kernel's tiles (``moe_mxfp4_gluon``; block_n / 16 warps): x copied once
# (``num_stages`` 1), or through a ring of ``num_stages`` stages of ``block_k`` (``x_stages``: a
# ring of three stages of three units is the K loop's nine); the words ``gluon_ahead`` units
# ahead; GEMM 1's gate and up rows in separate warps (``gluon_split``); row blocks of up to 8
# on its mma.sync kernel (``gluon_mma``); the words through x's ring (``gluon_staged``). Those
# of a sixteenth to twice the rows an expert are timed
_G = (True, None, True)  # swapped, no register cap, Gluon
GLUON = [(8, 64, 64, 64, 1, 4, 1, *_G), (8, 64, 64, 64, 1, 4, 1, *_G, 5),
         (8, 128, 128, 64, 1, 8, 1, *_G), (16, 64, 64, 192, 1, 4, 3, *_G),
         (16, 64, 64, 192, 1, 4, 5, *_G), (32, 64, 64, 192, 1, 4, 3, *_G),
         (32, 64, 64, 320, 1, 4, 3, *_G, 4), (64, 64, 64, 192, 1, 4, 3, *_G),
         # split
         (8, 64, 64, 64, 1, 4, 1, *_G, 2, True), (8, 64, 64, 64, 1, 4, 1, *_G, 5, True),
         (8, 64, 64, 192, 1, 4, 3, *_G, 2, True), (8, 64, 64, 320, 1, 4, 3, *_G, 4, True),
         (16, 64, 64, 192, 1, 4, 3, *_G, 2, True), (32, 64, 64, 192, 1, 4, 3, *_G, 2, True),
         (32, 64, 64, 192, 1, 4, 5, *_G, 2, True), (32, 64, 64, 320, 1, 4, 3, *_G, 4, True),
         (64, 64, 64, 192, 1, 4, 3, *_G, 2, True), (64, 128, 128, 192, 1, 8, 3, *_G, 2, True),
         (128, 64, 64, 192, 1, 4, 3, *_G, 2, True), (128, 128, 128, 192, 1, 8, 3, *_G, 2, True),
         # 16-row blocks with x copied once (92 KB): no barrier in the K loop, words 3-5 ahead
         (16, 64, 64, 64, 1, 4, 1, *_G, 3), (16, 64, 64, 64, 1, 4, 1, *_G, 5, True),
         (16, 128, 128, 64, 1, 8, 1, *_G, 5, True),
         # prefill: rings of one-unit stages (a barrier a unit, but 16 KB a stage at 128 rows)
         (64, 128, 128, 64, 1, 8, 5, *_G, 2, True), (128, 64, 64, 64, 1, 4, 5, *_G, 2, True),
         (128, 128, 128, 64, 1, 8, 5, *_G, 2, True), (256, 128, 128, 64, 1, 8, 3, *_G, 2, True),
         # the words through x's ring with it (each thread its own 16 bytes a unit, read back
         # from shared memory): ``num_stages - 2`` stages in flight, no register ring
         *[(m, n, n, bk, 1, n // 16, st, *_G, 2, split, False, True)
           for m, n, bk, st, split in ((8, 64, 64, 9, True), (16, 64, 64, 5, True),
                                       (16, 64, 64, 9, True), (16, 64, 192, 3, False),
                                       (32, 64, 192, 3, False), (32, 64, 64, 5, True),
                                       (32, 64, 64, 9, True), (32, 64, 64, 9, False),
                                       (32, 128, 64, 9, True), (64, 64, 64, 9, True),
                                       (64, 128, 64, 9, True), (128, 128, 64, 5, True),
                                       # 256 rows (prefill: 255 registers, 185 KB, one
                                       # program an SM); 16 rows on 128; 256 rows on 16
                                       # warps; a ring of 15
                                       (256, 128, 64, 5, True),
                                       (16, 128, 64, 9, True), (16, 256, 64, 9, True),
                                       (32, 256, 64, 9, True), (32, 128, 64, 15, True),
                                       # three units a stage: a CTA barrier every three
                                       (16, 128, 192, 3, True), (32, 128, 192, 3, True),
                                       (64, 128, 192, 3, True), (32, 256, 192, 3, True))],
         # the staged 128-row tile over a ring of five with its registers capped, for more
         # warps an SM (the 9-stage tile: 110 registers and 83 KB, two programs; sass_moe,
         # sm_90, no spill): 32 rows at 64 (63 registers, four programs) and 80 (67, three),
         # 16 rows at 56 (55, five; its wgmmas serialized) and 80 (80, three; not)
         *[(m, 128, 128, 64, 1, 8, 5, True, cap, True, 2, True, False, True)
           for m, cap in ((32, 64), (32, 80), (16, 56), (16, 80))],
         # the same, each unit's wgmma in two 32-deep halves (``gluon_halves``): under a cap
         # its wgmmas stay pipelined (sass_moe --halves, sm_90): 32 rows at 64 and 72 registers
         # (four and three programs an SM), 16 rows at 56 and 64 (four); 128 rows for prefill,
         # uncapped (GEMM 1 128 registers against 164, two programs an SM instead of one; GEMM 2
         # 205) and at 128 (GEMM 2 too, spilling in its epilogue only)
         *[(m, 128, 128, 64, 1, 8, 5, True, cap, True, 2, True, False, True, False, True)
           for m, cap in ((32, 64), (32, 72), (16, 56), (16, 64), (128, None), (128, 128))],
         # row blocks of 8 with x copied once, in halves: 86 registers against 144
         (8, 64, 64, 64, 1, 4, 1, *_G, 2, False, False, False, False, True),
         # 256 weight rows on 16 warps in halves: a row block's x read once for 128 outputs of
         # GEMM 1 instead of 64 (half the L2's traffic of x), 61-71 registers at 8-32 rows and
         # 93 at 64 (sass_moe, sm_90, none serialized): two programs an SM, 32 warps
         *[(m, 256, 256, 64, 1, 16, 5, True, None, True, 2, True, False, True, False, True)
           for m in (8, 16, 32, 64)],
         # the staged 128-row tile with its warps specialized (a copy warpgroup, two MMA
         # warpgroups, mbarriers): rings of eight and four one-unit slots, row blocks of 16
         # and 32 (the launcher refuses 64)
         *[(m, 128, 128, 64, 1, 8, st, *_G, 2, False, False, True, True)
           for m, st in ((16, 8), (32, 8), (32, 4))],
         # row blocks of 1-8 on the mma.sync kernel (block_n / 16 warps, no shared memory)
         *[(m, n, n, 64, 1, n // 16, 1, *_G, ahead, False, True)
           for m, n, ahead in ((1, 16, 2), (1, 16, 4), (1, 32, 4), (2, 16, 4), (4, 16, 4),
                               (4, 32, 4), (8, 16, 4), (8, 32, 4), (8, 64, 4))],
         # the same with the words through a ring of ``num_stages`` slots in shared memory
         *[(m, n, n, 64, 1, n // 16, st, *_G, 2, False, True, True)
           for m, n, st in ((1, 16, 8), (1, 16, 15), (1, 32, 9), (2, 16, 9), (4, 16, 9),
                            (4, 32, 9), (8, 16, 9), (8, 16, 15))]]


def fragment_experts(w13, w2, scales) -> tuple:
    """``bench_moe.inputs``' MXFP4 experts (word layout, ``Mxfp4Scales``) in the fragment
    layout: (w13, w2, w13's scales, w2's)."""
    (f13, t13), (f2, t2) = (to_fragments(from_words(w), s)
                            for w, s in ((w13, scales.w13), (w2, scales.w2)))
    return f13, f2, t13, t2


def candidates(rows: float, gluon_only: bool = False) -> list[tuple]:
    """The tiles worth timing at ``rows`` routed rows an expert: the GEMV up to one row, the
    Triton tiles from the smallest blocks that hold the rows, or the Gluon kernel's tiles of a
    sixteenth to twice the rows (its mma.sync tiles up to 8 rows, of half to twice them)."""
    if gluon_only:
        return [g for g in GLUON if (rows <= 8 and min(rows, 8) / 2 <= g[0] <= max(1, 2 * rows)
                                     if MoeConfig(*g).gluon_mma else
                                     rows / 16 <= g[0] <= max(8, 2 * rows))]
    return (GEMV if rows <= 1 else []) + [
        t for t in TILES if not (t[0] > 16 and rows < 8 or t[0] > 32 and rows < 32)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 128, 256, 512])
    p.add_argument("--out", default="bench-out")
    p.add_argument("--gluon", action="store_true",
                   help="also the Gluon kernel's tiles (GLUON) and the table it picks")
    p.add_argument("--gluon-only", action="store_true",
                   help="the Gluon kernel's tiles and the table it picks against the Triton "
                        "tiles' table alone (no sweep of TILES)")
    p.add_argument("--profile", action="store_true",
                   help="no timing: the fragment layout's picked tiles (with --gluon: the Gluon "
                        "backend's), three calls a token count, for a profiler (ncu "
                        "--launch-skip 2 --launch-count 2: GEMM 1 and GEMM 2 of the second call)")
    p.add_argument("--config", type=ast.literal_eval,
                   help="with --profile: this tile in place of the table's, ``MoeConfig``'s "
                        "fields as a tuple (the tuner's keys, e.g. '(16, 128, 128, 64, 1, 8, 9, "
                        "True, None, True, 2, True, False, True, False)')")
    p.add_argument("--kernels", action="store_true",
                   help="no sweep: each kernel's device time (torch.profiler, L2 not flushed) "
                        "of the word layout's table and of the Gluon backend's, a token count")
    a = p.parse_args()
    bench_moe.H, bench_moe.INTER, bench_moe.E, bench_moe.K = 2880, 2880, 32, 4
    rows = []
    for tokens in a.tokens:
        args, kw = inputs(tokens, mx=True)
        x, w13, w2, weights, ids = args
        f13, f2, t13, t2 = fragment_experts(w13, w2, kw["scales"])
        fkw = dict(kw, scales=FragmentScales(t13, t2))
        gkw = dict(kw, scales=GluonFragmentScales(t13, t2))
        if a.profile:  # the Triton tiles' table, or with --gluon(-only) the Gluon backend's
            cfg = MoeConfig(*a.config) if a.config else None
            for _ in range(3):
                fused_moe(x, f13, f2, weights, ids, config=cfg,
                          **(gkw if a.gluon or a.gluon_only else fkw))
            torch.cuda.synchronize()
            continue
        if a.kernels:  # where a step's MoE time goes: the GEMMs, the alignment, the sum
            print(json.dumps({"tokens": tokens, "words_us": bench_moe.kernel_times(
                lambda: fused_moe(*args, **kw)), "gluon_us": bench_moe.kernel_times(
                lambda: fused_moe(x, f13, f2, weights, ids, **gkw))}), flush=True)
            continue
        shipped = graph_ms(lambda: fused_moe(*args, **kw)) * 1e3
        ref = fused_moe(*args, **kw).float()
        row = {"tokens": tokens, "shipped_config": list(vars(config(tokens, True)).values()),
               "shipped_us": round(shipped, 1), "tiles": []}
        rows_an_expert = tokens * 4 / 32
        tiles = [(f, fkw) for f in [None] if a.gluon_only]  # None: the table's pick
        tiles += [(f, fkw) for f in ([] if a.gluon_only else candidates(rows_an_expert))]
        if a.gluon or a.gluon_only:
            tiles += [(f, gkw) for f in [None] + candidates(rows_an_expert, gluon_only=True)]
        for fields, scales_kw in tiles:
            cfg = MoeConfig(*fields) if fields else None
            fn = lambda c=cfg, k=scales_kw: fused_moe(  # noqa: E731
                x, f13, f2, weights, ids, config=c, **k)
            name = (["gluon"] if scales_kw is gkw else []) + list(fields or ["picked"])
            try:
                us = graph_ms(fn) * 1e3
                diff = (fn().float() - ref).abs().max().item() / ref.abs().max().item()
                row["tiles"].append({"tile": name, "us": round(us, 1),
                                     "max_diff": round(diff, 5)})
            except Exception as e:  # e.g. out of shared memory
                row["tiles"].append({"tile": name, "error": str(e)[:160]})
        timed = [t for t in row["tiles"] if "us" in t]
        best = min(timed, key=lambda t: t["us"])
        row["best"], row["ratio"] = best, round(shipped / best["us"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.profile or a.kernels:
        return
    gpu = torch.cuda.get_device_name().replace(" ", "-").lower()
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"moe_fragments_{gpu}")
    with open(stem + ".json", "w") as f:
        json.dump({"commit": project_commit(), "gpu": torch.cuda.get_device_name(),
                   "rows": rows}, f, indent=1)
    lines = [f"gpt-oss-20b's fused MoE (32 x 2880 x 2880, top 4), {torch.cuda.get_device_name()}, "
             f"commit `{project_commit()}`: fragment layout against the shipped word layout, "
             "us a call from CUDA graphs.", "",
             "| tokens | shipped (word layout) | fragment, best tile | tile (MoeConfig) | ratio |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['tokens']} | {r['shipped_us']} | {r['best']['us']} | {r['best']['tile']} | "
              f"{r['ratio']}x |" for r in rows]
    if a.gluon or a.gluon_only:  # the Gluon tiles against the Triton tiles' best
        lines += ["", "| tokens | Triton tiles' best | Gluon, best tile | tile (MoeConfig) | ratio "
                  "| largest difference |", "|---|---|---|---|---|---|"]
        for r in rows:
            timed = [t for t in r["tiles"] if "us" in t]
            tri = min((t for t in timed if t["tile"][0] != "gluon"), key=lambda t: t["us"])
            glu = min((t for t in timed if t["tile"][0] == "gluon"), key=lambda t: t["us"])
            lines.append(f"| {r['tokens']} | {tri['us']} | {glu['us']} | {glu['tile'][1:]} | "
                         f"{tri['us'] / glu['us']:.3f}x | {glu['max_diff']} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
