"""A library's MXFP4 MoE against minisgl's fused MoE at gpt-oss-20b's experts (32 x 2880 x 2880,
top 4, biases, clamped SwiGLU), the same weights and routing, in the same run: OpenAI's
``triton_kernels`` (``matmul_ogs``, what vLLM and SGLang run on Hopper; the default) or
FlashInfer's CUTLASS fused MoE with MXFP4 weights and bf16 activations (``--library
flashinfer``, Hopper's mixed-input grouped GEMMs; vLLM's other Hopper path for gpt-oss).

    python benchmark/kernels/bench_moe_triton_kernels.py [--library triton_kernels|flashinfer]
        [--tokens 1 4 16 64 200 800 2048 4096] [--out DIR]

Needs the library importable (``triton_kernels``: the package of the installed Triton's release;
FlashInfer: ``scripts/gpu_validate.sh moe-fi`` installs it, its kernels compiled on first use).
Each runs as the engine runs it: ours as ``--moe-backend triton`` (``moe/fused.py``), the library
as ``--moe-backend LIBRARY`` (``moe/matmul_ogs.py``: the experts converted to its layouts once,
the routing built from the top-k ids and weights every call; ``moe/flashinfer_mxfp4.py``: the
sizes padded to 3,072, x padded and the output sliced every call, the autotuner's pick on each
token count's first call). Per token count: both eagerly (``do_bench`` medians, L2 flushed: launch
overhead included) and replayed from a CUDA graph (how decode runs them), the ratio ours /
theirs of the graph times, and the largest difference of the outputs relative to ours' largest
magnitude. Writes ``<date>_moe_<library>_<gpu>.{json,md}`` to ``--out``.
"""

import argparse
import datetime
import json
import os
import re
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))
sys.path.insert(0, os.path.dirname(__file__))

from bench_common import project_commit  # noqa: E402
from bench_moe import graph_ms  # noqa: E402

import minisgl.models  # noqa: F401, E402  (first: importing minisgl.layers alone is circular)
from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales, create_moe_backend  # noqa: E402
from minisgl.moe.fused import WordExperts  # noqa: E402
from minisgl.quant.mxfp4 import quantize_mxfp4  # noqa: E402

E, K, H, INTER = 32, 4, 2880, 2880
ALPHA, LIMIT = 1.702, 7.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--library", choices=["triton_kernels", "flashinfer"],
                   default="triton_kernels")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 200, 800, 2048, 4096])
    p.add_argument("--out", default="bench-out", help="results (./bench-out)")
    a = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    w13, s13 = quantize_mxfp4(torch.randn(E, 2 * INTER, H, device=dev) * 0.02)
    w2, s2 = quantize_mxfp4(torch.randn(E, H, INTER, device=dev) * 0.02)
    b13 = torch.randn(E, 2 * INTER, device=dev, dtype=torch.bfloat16) * 0.1
    b2 = torch.randn(E, H, device=dev, dtype=torch.bfloat16) * 0.1
    act = MoeActivation("swiglu_clamped", ALPHA, LIMIT)
    scales, bias = Mxfp4Scales(s13, s2), ExpertBias(b13, b2)
    fused, theirs = create_moe_backend("triton"), create_moe_backend(a.library)
    words = fused.prepare_experts(w13, w2, scales, bias, act)  # the fused MoE's word layout
    layout = theirs.prepare_experts(w13, w2, scales, bias, act)
    assert not isinstance(layout, WordExperts), f"{a.library}'s layouts: a Hopper GPU"
    results = []
    for t in a.tokens:
        x = torch.randn(t, H, device=dev, dtype=torch.bfloat16)
        weights, ids = torch.topk(torch.randn(t, E, device=dev).softmax(-1), K, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).bfloat16()

        def ours():
            return fused.forward(x, w13, w2, weights, ids, scales, bias=bias, act=act,
                                 layout=words)

        def library():
            return theirs.forward(x, w13, w2, weights, ids, scales, bias=bias, act=act,
                                  layout=layout)

        yo, yt = ours().float(), library().float()
        row = dict(tokens=t, rel_diff=((yo - yt).abs().max() / yo.abs().max()).item(),
                   ours_eager_us=do_bench(ours, return_mode="median") * 1e3,
                   theirs_eager_us=do_bench(library, return_mode="median") * 1e3,
                   ours_graph_us=graph_ms(ours) * 1e3, theirs_graph_us=graph_ms(library) * 1e3)
        row["ours_over_theirs"] = row["ours_graph_us"] / row["theirs_graph_us"]
        print(json.dumps(row), flush=True)
        results.append(row)
    gpu, date = torch.cuda.get_device_name(), datetime.date.today().isoformat()
    lib = __import__(a.library)
    meta = dict(gpu=gpu, date=date, torch=torch.__version__, triton=triton.__version__,
                library=a.library, version=getattr(lib, "__version__", None),
                commit=project_commit())
    os.makedirs(a.out, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    stem = os.path.join(a.out, f"{date}_moe_{a.library}_{slug}")
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    lines = [f"# MXFP4 MoE: minisgl's fused MoE against {a.library}, {gpu}, {date}",
             "", f"gpt-oss-20b's experts, bf16 activations; torch {torch.__version__}, triton "
             f"{triton.__version__}, {a.library} {meta['version']}. Median us (L2 flushed).", "",
             "| tokens | ours eager | theirs eager | ours graph | theirs graph | ours / theirs "
             "(graph) | max rel diff |", "|---" * 7 + "|"]
    lines += [f"| {r['tokens']} | {r['ours_eager_us']:.1f} | {r['theirs_eager_us']:.1f} | "
              f"{r['ours_graph_us']:.1f} | {r['theirs_graph_us']:.1f} | "
              f"{r['ours_over_theirs']:.2f} | {r['rel_diff']:.3g} |" for r in results]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
