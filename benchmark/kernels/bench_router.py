"""The MoE router of a decode step: its linear layer then ``topk_route`` (two launches: the GEMV
at one token, cuBLAS from two) against ``router_topk`` (one launch), as the layers chain them,
at the decode batches it takes (up to 256 tokens at 32 experts, 64 at 128).

    python benchmark/kernels/bench_router.py [--tokens 1 4 16] [--out DIR]

Each case is timed the way decode runs it: one CUDA graph replays 48 layers, each an RMSNorm of
the layer's input (the kernel before the router in every MoE layer) then its router, all with
PDL, over 48 copies of the router's weight (as many as a model's layers), L2 flushed before each
replay (in a decode step the experts' gigabytes stream between two layers' routers). ``router
us`` is a layer's time less that of the norm alone in the same graph; ``ratio`` the two
launches' time over the fused one's. The routers are gpt-oss's (32
experts, a bias, top 4), Qwen3-30B-A3B's (128, top 8) and Gemma 4 26B-A4B's (128, top 8, with
its scales: the input's two multiplies, the experts' scales and the cast, five launches of
torch, in the unfused path as ``MoELayer`` ran them).
Writes JSON and markdown named ``<date>_router_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import gpu_name  # noqa: E402
from bench_moe import graph_ms  # noqa: E402

from minisgl.kernel.triton.norm import rms_norm  # noqa: E402
from minisgl.kernel.triton.router_topk import fits, router_topk, router_workspace  # noqa: E402
from minisgl.kernel.triton.topk_route import topk_route  # noqa: E402
from minisgl.quant.unquantized import linear  # noqa: E402

ROUTERS = {  # experts, hidden, top k, bias, softmax first, Gemma 4's scales
    "gpt-oss-20b": (32, 2880, 4, True, False, False),
    "qwen3-30b-a3b": (128, 2048, 8, False, True, False),
    "gemma-4-26b-a4b": (128, 2816, 8, False, True, True),
}
LAYERS = 48


def time_layers(route, xs: list[torch.Tensor], norm_w: torch.Tensor) -> float:
    """Seconds a layer: one graph of ``LAYERS`` (norm, ``route(layer, normed)``), L2 flushed
    before each replay (``bench_moe.graph_ms``)."""
    def step():
        for i, x in enumerate(xs):
            h = rms_norm(x, norm_w, 1e-5, pdl=True)
            if route is not None:
                route(i, h)

    return graph_ms(step) / 1e3 / LAYERS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 16, 64, 128, 256])
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    args = parser.parse_args()

    records = []
    for model, (experts, hidden, k, has_bias, softmax_first, scales) in ROUTERS.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        ws = [torch.randn(experts, hidden, device="cuda", generator=g, dtype=torch.bfloat16)
              * hidden ** -0.5 for _ in range(LAYERS)]
        bs = [torch.randn(experts, device="cuda", generator=g, dtype=torch.bfloat16) * 0.1
              if has_bias else None for _ in range(LAYERS)]
        spaces = [router_workspace(w) for w in ws]
        in_scale = es = None
        mult = hidden ** -0.5
        if scales:
            in_scale = 1 + 0.1 * torch.randn(hidden, device="cuda", generator=g,
                                             dtype=torch.bfloat16)
            es = 1 + 0.1 * torch.randn(experts, device="cuda", generator=g, dtype=torch.bfloat16)
        norm_w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
        for tokens in args.tokens:
            xs = [torch.randn(tokens, hidden, device="cuda", generator=g, dtype=torch.bfloat16)
                  for _ in range(LAYERS)]
            if not fits(xs[0], ws[0]):
                continue

            def two(i, h):
                if in_scale is None:
                    return topk_route(linear(h, ws[i], bs[i], pdl=True), k, softmax_first,
                                      softmax_first, torch.bfloat16, pdl=True)
                weights, ids = topk_route(linear(h * in_scale * mult, ws[i], bs[i], pdl=True),
                                          k, softmax_first, softmax_first, pdl=True)
                return (weights * es[ids]).to(torch.bfloat16), ids

            def one(i, h):
                return router_topk(h, ws[i], bs[i], k, softmax_first, softmax_first, spaces[i],
                                   torch.bfloat16, True, in_scale, mult, es)

            h = rms_norm(xs[0], norm_w, 1e-5)
            (w2, i2), (w1, i1) = two(0, h), one(0, h)
            same = bool(torch.equal(i1, i2))
            err = (w1.float() - w2.float()).abs().max().item()
            t_norm = time_layers(None, xs, norm_w)
            t_two, t_one = time_layers(two, xs, norm_w), time_layers(one, xs, norm_w)
            rec = {"model": model, "experts": experts, "hidden": hidden, "k": k,
                   "tokens": tokens, "same_ids": same, "max_weight_diff": round(err, 5),
                   "norm_us": round(t_norm * 1e6, 2),
                   "two_launches_us": round((t_two - t_norm) * 1e6, 2),
                   "fused_us": round((t_one - t_norm) * 1e6, 2),
                   "ratio": round((t_two - t_norm) / max(t_one - t_norm, 1e-9), 3)}
            records.append(rec)
            print(json.dumps(rec), flush=True)

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{datetime.date.today().isoformat()}_router_{gpu_name()}")
    with open(stem + ".json", "w") as f:
        json.dump(records, f, indent=1)
    lines = [f"The MoE router in a decode chain, bf16, {torch.cuda.get_device_name()}: its linear "
             "layer then the top-k (two launches) against `router_topk` (one), each after an "
             f"RMSNorm, {LAYERS} layers a CUDA graph with PDL; router us = a layer less the norm "
             "alone.", "",
             "| router | tokens | norm us | two launches us | fused us | ratio | same ids | "
             "max weight diff |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['model']} ({r['experts']} x {r['hidden']}, top {r['k']}) | "
                     f"{r['tokens']} | {r['norm_us']} | {r['two_launches_us']} | "
                     f"{r['fused_us']} | {r['ratio']} | {r['same_ids']} | "
                     f"{r['max_weight_diff']} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
