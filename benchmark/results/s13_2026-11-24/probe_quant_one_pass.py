"""Probe (session 13): per-token quantization of the o and down inputs, the whole row in one load
(``pick_block`` now) against the former two passes of 1024-column steps (``ONE_PASS=False``, the
same kernel). CUDA graphs of 64 calls; inputs cycled so that they come from DRAM."""
import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "offline"))

from bench_gemv import time_graph  # noqa: E402
from minisgl.kernel.triton.fp8_quant import _quantize_tokens_kernel, pick_block  # noqa: E402


def quant(x, k, gated, one_pass):
    m = x.shape[0]
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    block, warps = pick_block(k) if one_pass else (1024, 4)
    _quantize_tokens_kernel[(m,)](x, q, s, k, x.stride(0), q.stride(0), GATED=gated,
                                  ONE_PASS=one_pass, BLOCK=block, num_warps=warps)
    return q, s


res = []
for name, k, gated in (("o", 4096, False), ("down", 12288, True)):
    for m in (2, 16, 64, 128, 256):
        xs = [torch.randn(m, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
              for _ in range(64)]
        a, b = quant(xs[0], k, gated, True), quant(xs[0], k, gated, False)
        same = bool(torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8))
                    and torch.equal(a[1], b[1]))
        # rotate the inputs (the "weights" argument of time_graph) so each call reads DRAM
        t_new = time_graph(lambda _, x: quant(x, k, gated, True), xs, None)
        t_old = time_graph(lambda _, x: quant(x, k, gated, False), xs, None)
        res.append(dict(layer=name, m=m, one_pass_us=round(t_new * 1e6, 2),
                        two_pass_us=round(t_old * 1e6, 2), bit_equal=same))
        print(json.dumps(res[-1]), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "probe_quant_one_pass.json"), "w") as f:
    json.dump(res, f, indent=1)
