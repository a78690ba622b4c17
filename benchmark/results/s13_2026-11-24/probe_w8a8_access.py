"""Probe (session 13): why the W8A8 GEMM streams the 4,096-row layers (o, down) at ~1.5-1.8 TB/s.

1. ``read``: a kernel that only reads an e4m3 weight [N, K] in [BN, BK] tiles (int32 words summed),
   as the W8A8 GEMM walks it, against a torch reduction over the same bytes (the read ceiling):
   split-K (more independent streams), pipelining stages, and K rotation (program p starts its
   K loop at step p * ROT, so concurrent programs read different column ranges).
2. ``w8a8``: the GEMM's main loop (a copy of ``_w8a16_kernel``'s A8 path) with the same knobs,
   against the real ``fp8_w8a8_gemm``.
Times: CUDA graphs over L2-cold weight copies (``bench_gemv.time_graph``).
"""
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "offline"))

from bench_gemv import L2_FLUSH_BYTES, time_graph  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16 import _sum_splits_kernel, fp8_w8a8_gemm, pick_config  # noqa


@triton.jit
def read_probe(w_ptr, out_ptr, K4, steps, ROT: tl.constexpr, BN: tl.constexpr,
               BK4: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    first = tl.program_id(1) * steps
    rot = (pid_n * ROT) % steps
    rows = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    cols = tl.arange(0, BK4)
    acc = tl.zeros((BN, BK4), dtype=tl.int32)
    for i in tl.range(0, steps, num_stages=STAGES):
        kb = first + (i + rot) % steps
        acc += tl.load(w_ptr + rows[:, None] * K4 + kb * BK4 + cols[None, :])
    tl.store(out_ptr + tl.program_id(1) * tl.num_programs(0) + pid_n, tl.sum(tl.sum(acc, 1), 0))


def run_read(w, bn, bk, split, stages, rot):
    n, k = w.shape
    w32 = w.view(torch.int32)
    steps = k // bk // split
    out = torch.empty(n // bn * split, dtype=torch.int32, device=w.device)
    read_probe[(n // bn, split)](w32, out, k // 4, steps, ROT=rot, BN=bn, BK4=bk // 4,
                                 STAGES=stages, num_warps=4)
    return out


@triton.jit
def w8a8_probe(x_ptr, xs_ptr, w_ptr, s_ptr, y_ptr, M, N, K, steps, ROT: tl.constexpr,
               SPLIT: tl.constexpr, EVEN_M: tl.constexpr, PROMOTE: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_m = tl.program_id(0) % tiles_m
    pid_n = tl.program_id(0) // tiles_m
    first = tl.program_id(1) * steps
    rot = (pid_n * ROT) % steps
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    rows_w = offs_n.to(tl.int64)
    rows_x = tl.where(m_ok, offs_m, 0).to(tl.int64)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(0, steps):
        k0 = (first + (i + rot) % steps) * BLOCK_K
        w = tl.load(w_ptr + rows_w[:, None] * K + (k0 + ks)[None, :])
        if EVEN_M:
            x = tl.load(x_ptr + rows_x[:, None] * K + (k0 + ks)[None, :])
        else:
            x = tl.load(x_ptr + rows_x[:, None] * K + (k0 + ks)[None, :], mask=m_ok[:, None],
                        other=0.0)
        if PROMOTE:
            acc = tl.dot(w, tl.trans(x), acc, max_num_imprecise_acc=BLOCK_K)
        else:
            acc = tl.dot(w, tl.trans(x), acc)
    acc *= tl.load(s_ptr + rows_w)[:, None]
    acc *= tl.load(xs_ptr + rows_x)[None, :]
    if SPLIT:
        y_ptr += tl.program_id(1).to(tl.int64) * M * N
    tl.store(y_ptr + rows_x[None, :] * N + offs_n[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[None, :])


def run_w8a8(xq, xs, w, ws, bm, bn, bk, split, warps, stages, rot):
    m, k = xq.shape
    n = w.shape[0]
    steps = k // bk // split
    y = torch.empty((m, n), dtype=torch.bfloat16, device=w.device)
    out = y if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=w.device)
    w8a8_probe[(triton.cdiv(m, bm) * (n // bn), split)](
        xq, xs, w, ws, out, m, n, k, steps, ROT=rot, SPLIT=split > 1, EVEN_M=m % bm == 0,
        PROMOTE=k > 4096, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
        num_stages=stages)
    if split > 1:
        _sum_splits_kernel[(triton.cdiv(m * n, 1024),)](out, w, y, m * n, n, SPLITS=split,
                                                       HAS_BIAS=False, BLOCK=1024, num_warps=4)
    return y


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else "all"
    res = []
    layers = {"o": (4096, 4096), "down": (4096, 12288), "qkv": (6144, 4096)}
    for name, (n, k) in layers.items():
        copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
        ws = [(torch.randint(0, 100, (n, k), device="cuda", dtype=torch.int8)  # no NaN codes
               .view(torch.float8_e4m3fn), torch.rand(n, 1, device="cuda") * 1e-2)
              for _ in range(copies)]
        ceil = time_graph(lambda a, w: w[0].view(torch.int32).max(), ws, None)
        res.append(dict(kind="torch_max", layer=name, us=round(ceil * 1e6, 2),
                        tb_s=round(n * k / ceil / 1e12, 3)))
        print(json.dumps(res[-1]), flush=True)
        if only in ("all", "read"):
            grid = [(64, 256, s, st, r) for s, st, r in itertools.product(
                [1, 2, 4], [1, 3, 5], [0, 1])]
            grid += [(16, 256, 1, 3, r) for r in (0, 1)] + [(4, 2048, 1, 1, 0), (4, 2048, 1, 2, 0)]
            grid += [(64, 1024, 1, 3, r) for r in (0, 1)] + [(32, 512, 1, 3, r) for r in (0, 1)]
            for bn, bk, s, st, r in grid:
                if k // bk // s < 2:
                    continue
                t = time_graph(lambda a, w: run_read(w[0], bn, bk, s, st, r), ws, None)
                res.append(dict(kind="read", layer=name, bn=bn, bk=bk, split=s, stages=st, rot=r,
                                programs=n // bn * s, us=round(t * 1e6, 2),
                                tb_s=round(n * k / t / 1e12, 3)))
                print(json.dumps(res[-1]), flush=True)
        if only in ("all", "w8a8"):
            for m in (16, 64, 128, 256):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                xq, xs = quantize_tokens(x, False)
                ref = fp8_w8a8_gemm(xq, xs, *ws[0])
                t = time_graph(lambda a, w: fp8_w8a8_gemm(a[0], a[1], *w), ws, (xq, xs))
                cfg = pick_config(m, n, k, x_bytes=1)
                res.append(dict(kind="w8a8_real", layer=name, m=m, cfg=str(cfg),
                                us=round(t * 1e6, 2), tb_s=round(n * k / t / 1e12, 3)))
                print(json.dumps(res[-1]), flush=True)
                base = (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages)
                variants = [base + (1, 0), base + (1, 1), base + (1, 5), base + (2, 0),
                            base + (2, 1), base[:4] + (3, 1, 0), base[:4] + (3, 1, 1),
                            (cfg.block_m, 64, 128, 4, 4, 1, 1), (cfg.block_m, 64, 128, 4, 6, 1, 1)]
                if m >= 64:
                    variants += [(m // 2 if m <= 128 else 64, 64, 256, 4, 4, 1, 1)]
                for bm, bn, bk, wp, st, sp, r in variants:
                    if k // bk // sp < 2:
                        continue
                    try:
                        y = run_w8a8(xq, xs, ws[0][0], ws[0][1], bm, bn, bk, sp, wp, st, r)
                        err = ((y.float() - ref.float()).abs().max()
                               / ref.float().abs().max()).item()
                        t = time_graph(lambda a, w: run_w8a8(a[0], a[1], w[0], w[1], bm, bn, bk,
                                                             sp, wp, st, r), ws, (xq, xs))
                    except Exception as e:  # noqa: BLE001
                        print(name, m, (bm, bn, bk, wp, st, sp, r), "failed", type(e).__name__)
                        continue
                    res.append(dict(kind="w8a8_probe", layer=name, m=m,
                                    cfg=(bm, bn, bk, wp, st, sp, r), err=round(err, 5),
                                    us=round(t * 1e6, 2), tb_s=round(n * k / t / 1e12, 3)))
                    print(json.dumps(res[-1]), flush=True)
        del ws
        torch.cuda.empty_cache()
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "probe_w8a8_access.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
