"""The in-place Gated DeltaNet decode kernels (``kernel/triton/gated_delta.py``) against the memory
bandwidth they need: one decode step of one linear-attention layer of Qwen3.5-9B (16 key heads,
32 value heads of 128 x 128) over a batch whose states lie in scattered slots of the pool.

    python benchmark/kernels/bench_gated_delta.py [--batch 1,64,232] [--out DIR]

GB/s counts the state read once and written once (fp32 or bf16) plus the conv window and the
inputs; ``--sweep`` also times the delta-rule kernel's block shapes (``BV``, warps) so the default
can be chosen from data. Writes ``gated_delta_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import cuda_ms, gpu_name  # noqa: E402

from minisgl.kernel.triton import gated_delta as k  # noqa: E402

HK, HV, D, W = 16, 32, 128, 4


def case(batch: int, state_dtype: torch.dtype, sweep: bool) -> list[dict]:
    dev = "cuda"
    slots_total = max(2 * batch, 8)
    conv_dim = 2 * HK * D + HV * D
    ssm = torch.randn(slots_total, HV, D, D, device=dev).to(state_dtype) * 0.01
    conv = torch.randn(slots_total, conv_dim, W - 1, device=dev, dtype=torch.bfloat16)
    slots = torch.randperm(slots_total, device=dev)[:batch].to(torch.int32)
    x = torch.randn(batch, conv_dim, device=dev, dtype=torch.bfloat16)
    a = torch.randn(batch, HV, device=dev, dtype=torch.bfloat16)
    b = torch.randn(batch, HV, device=dev, dtype=torch.bfloat16)
    a_log = torch.randn(HV, device=dev)
    dt_bias = torch.randn(HV, device=dev)
    weight = torch.randn(conv_dim, W, device=dev, dtype=torch.bfloat16)
    state_bytes = 2 * batch * HV * D * D * ssm.element_size()
    conv_bytes = 2 * batch * conv_dim * (W - 1) * 2 + 2 * batch * conv_dim * 2
    rows = []
    name = str(state_dtype).split(".")[-1]
    ms = cuda_ms(lambda: k.conv_decode(x, weight, conv, slots))
    rows.append(dict(kernel="conv_decode", batch=batch, state=name, ms=ms,
                     gbps=conv_bytes / ms / 1e6))
    configs = [(None, None)]
    if sweep:
        configs += [(bv, w) for bv in (8, 16, 32, 64, 128) for w in (1, 2, 4, 8)]
    for bv, warps in configs:
        fn = lambda: k.gdn_decode(x, a, b, a_log, dt_bias, ssm, slots, HK, D, D**-0.5,  # noqa: E731
                                  block_v=bv, num_warps=warps)
        ms = cuda_ms(fn)
        label = "gdn_decode" if bv is None else f"gdn_decode BV={bv} warps={warps}"
        rows.append(dict(kernel=label, batch=batch, state=name, ms=ms,
                         gbps=(state_bytes + batch * conv_dim * 2) / ms / 1e6))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", default="1,64,232")
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args()
    rows = []
    for batch in map(int, args.batch.split(",")):
        for dtype in (torch.float32, torch.bfloat16):
            rows += case(batch, dtype, args.sweep)
    gpu = gpu_name()
    lines = [f"Gated DeltaNet decode kernels, one layer of Qwen3.5-9B, {gpu}", "",
             "| kernel | batch | state | ms | GB/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['kernel']} | {r['batch']} | {r['state']} | {r['ms']:.4f} | {r['gbps']:.0f} |"
              for r in rows]
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"gated_delta_{gpu}.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, f"gated_delta_{gpu}.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
