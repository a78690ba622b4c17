"""OpenAI's ``triton_kernels`` (``matmul_ogs``, the MXFP4 MoE GEMMs vLLM and SGLang run on Hopper)
against minisgl's fused MoE at gpt-oss-20b's experts (32 x 2880 x 2880, top 4, biases, clamped
SwiGLU), the same weights and routing, in the same run.

    python benchmark/kernels/bench_moe_triton_kernels.py [--tokens 1 4 16 64 200 800 2048 4096]
        [--out DIR]

Needs ``triton_kernels`` importable (the wheel of the installed Triton's version). Its weights are
swizzled into its Hopper layouts (values and scales, K the MX axis; the scales padded to a
multiple of 4 groups, which 3.6.0 reads past), gate and up rows interleaved, the SwiGLU fused
into the first GEMM and the routing weights into the second, as vLLM calls it. Per token count:
both MoEs eagerly (``do_bench`` medians, L2 flushed: launch overhead included) and replayed from a
CUDA graph (how decode runs them), the ratio ours / theirs of the graph times, and the largest
difference of the outputs relative to ours' largest magnitude. Writes
``<date>_moe_triton_kernels_<gpu>.{json,md}`` to ``--out``.
"""
import argparse
import datetime
import json
import os
import re
import sys

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from triton_kernels.matmul_ogs import (
    FlexCtx,
    FnSpecs,
    FusedActivation,
    GatherIndx,
    PrecisionConfig,
    RoutingData,
    ScatterIndx,
    matmul_ogs,
)
from triton_kernels.numerics import InFlexData
from triton_kernels.swiglu import swiglu_fn
from triton_kernels.tensor import (
    FP4,
    convert_layout,
    make_ragged_tensor_metadata,
    wrap_torch_tensor,
)
from triton_kernels.tensor_details import layout
from triton_kernels.topk import topk

import minisgl.models  # noqa: F401  (first: importing minisgl.layers alone is circular)
from minisgl.kernel.triton.fused_moe import fused_moe
from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales
from minisgl.quant.mxfp4 import quantize_mxfp4

E, K, H, INTER = 32, 4, 2880, 2880
ALPHA, LIMIT = 1.702, 7.0


def swizzle(w, s):
    """[E, N, K/2] u8 and [E, N, K/32] e8m0 -> triton_kernels' Hopper layouts (K the MX axis)."""
    s = F.pad(s, (0, -s.shape[-1] % 4))  # 3.6.0 reads past K/32 % 4 != 0 (vLLM #47303)
    v_cls, v_opts = layout.make_default_matmul_mxfp4_w_layout(mx_axis=1)
    s_cls, s_opts = layout.make_default_matmul_mxfp4_w_scale_layout(mx_axis=1, num_warps=8)
    wt = convert_layout(wrap_torch_tensor(w.transpose(-2, -1), dtype=FP4), v_cls, **v_opts)
    st = convert_layout(wrap_torch_tensor(s.transpose(-2, -1)), s_cls, **s_opts)
    return wt, PrecisionConfig(weight_scale=st, flex_ctx=FlexCtx(rhs_data=InFlexData()))


def interleave(t):  # [E, 2 INTER, ...] gate rows then up rows -> row 2j gate j, 2j + 1 up j
    return torch.stack(t.chunk(2, dim=1), dim=2).flatten(1, 2).contiguous()


def routing(logits):
    """vLLM's path from logits: topk -> gate scales in expert order, gather/scatter indices."""
    sm = topk(logits, K, apply_softmax=True)  # softmax over the top k (gpt-oss)
    md = sm.mask_metadata
    combine, dispatch = md.col_sorted_indx, md.row_sorted_indx
    ragged = make_ragged_tensor_metadata(md.col_sum, logits.shape[0] * K)
    gate = sm.vals.flatten()[combine]
    rd = RoutingData(gate, md.col_sum, E, K, ragged)
    return rd, GatherIndx(combine, dispatch), ScatterIndx(dispatch, combine), sm


def graphed(fn):
    """fn captured in a CUDA graph (how the engine runs decode): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    w13_t, pc13 = swizzle(interleave(w13), interleave(s13))
    w2_t, pc2 = swizzle(w2, s2)
    swiglu = FusedActivation(FnSpecs("swiglu", swiglu_fn, ("alpha", "limit"), reduction_n=2),
                             (ALPHA, LIMIT))
    b13_il, b2_f = interleave(b13).float(), b2.float()
    results = []
    for t in a.tokens:
        x = torch.randn(t, H, device=dev, dtype=torch.bfloat16)
        rd, gi, si, sm = routing(torch.randn(t, E, device=dev, dtype=torch.float32))
        ids, weights = sm.indx.to(torch.int32), sm.vals.to(torch.bfloat16)

        def ours():
            return fused_moe(x, w13, w2, weights, ids, scales=Mxfp4Scales(s13, s2),
                             bias=ExpertBias(b13, b2), act=act)

        def theirs():
            h = matmul_ogs(x, w13_t, b13_il, rd, gather_indx=gi, precision_config=pc13,
                           fused_activation=swiglu)
            return matmul_ogs(h, w2_t, b2_f, rd, scatter_indx=si, precision_config=pc2,
                              gammas=rd.gate_scal)

        yo, yt = ours().float(), theirs().float()
        row = dict(tokens=t, rel_diff=((yo - yt).abs().max() / yo.abs().max()).item(),
                   ours_eager_us=do_bench(ours, return_mode="median") * 1e3,
                   theirs_eager_us=do_bench(theirs, return_mode="median") * 1e3,
                   ours_graph_us=do_bench(graphed(ours), return_mode="median") * 1e3,
                   theirs_graph_us=do_bench(graphed(theirs), return_mode="median") * 1e3)
        row["ours_over_theirs"] = row["ours_graph_us"] / row["theirs_graph_us"]
        print(json.dumps(row), flush=True)
        results.append(row)
    gpu, date = torch.cuda.get_device_name(), datetime.date.today().isoformat()
    import triton_kernels
    meta = dict(gpu=gpu, date=date, torch=torch.__version__, triton=triton.__version__,
                triton_kernels=getattr(triton_kernels, "__version__", None),
                commit=os.environ.get("MINISGL_COMMIT"))
    os.makedirs(a.out, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    stem = os.path.join(a.out, f"{date}_moe_triton_kernels_{slug}")
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, results=results), f, indent=1)
    lines = [f"# MXFP4 MoE: minisgl's fused MoE against triton_kernels' matmul_ogs, {gpu}, {date}",
             "", f"gpt-oss-20b's experts, bf16 activations; torch {torch.__version__}, triton "
             f"{triton.__version__}. Median us (L2 flushed).", "",
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
