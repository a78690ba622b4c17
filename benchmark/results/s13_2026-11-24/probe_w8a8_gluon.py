"""Gluon W8A8 probe: swap-AB e4m3 GEMM, TMA ring + mbarriers + async wgmma (one warpgroup)."""
import json
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "offline"))


@gluon.jit
def w8a8_gl(w_desc, x_desc, ws_ptr, xs_ptr, y_ptr, M, N, K,
            BN: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
            num_warps: gl.constexpr):
    tiles_m = gl.cdiv(M, BM)
    pid = gl.program_id(0)
    pid_m = pid % tiles_m
    pid_n = pid // tiles_m
    off_n = pid_n * BN
    off_m = pid_m * BM
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BN, BK], w_desc.layout)
    x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, BK], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    nbytes: gl.constexpr = (BN + BM) * BK
    nk = gl.cdiv(K, BK)
    for i in gl.static_range(STAGES - 1):
        mbarrier.expect(bars.index(i), nbytes)
        tma.async_copy_global_to_shared(w_desc, [off_n, i * BK], bars.index(i), w_smem.index(i))
        tma.async_copy_global_to_shared(x_desc, [off_m, i * BK], bars.index(i), x_smem.index(i))
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BM, 32])
    acc = gl.zeros((BN, BM), gl.float32, layout)
    for k in range(nk):
        s = k % STAGES
        mbarrier.wait(bars.index(s), (k // STAGES) & 1)
        acc = warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=1,
                                       deps=(acc, w_smem.index(s), x_smem.index(s)))
        nxt = k + STAGES - 1
        if nxt < nk:
            ns = nxt % STAGES
            mbarrier.expect(bars.index(ns), nbytes)
            tma.async_copy_global_to_shared(w_desc, [off_n, nxt * BK], bars.index(ns),
                                            w_smem.index(ns))
            tma.async_copy_global_to_shared(x_desc, [off_m, nxt * BK], bars.index(ns),
                                            x_smem.index(ns))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    rows = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    cols = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    acc = acc * gl.load(ws_ptr + rows)[:, None]
    acc = acc * gl.load(xs_ptr + cols, mask=cols < M, other=0.0)[None, :]
    ptrs = y_ptr + cols[None, :].to(gl.int64) * N + rows[:, None]
    gl.store(ptrs, acc.to(gl.bfloat16), mask=(cols < M)[None, :] & (rows < N)[:, None])


@gluon.jit
def _ws_loader(w_desc, x_desc, w_smem, x_smem, ready, empty, off_n, off_m, nk,
               BK: gl.constexpr, STAGES: gl.constexpr):
    for k in range(nk):
        s = k % STAGES
        mbarrier.wait(empty.index(s), ((k // STAGES) & 1) ^ 1)  # barriers start "phase 1 done"
        mbarrier.expect(ready.index(s), w_desc.block_type.nbytes + x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(w_desc, [off_n, k * BK], ready.index(s), w_smem.index(s))
        tma.async_copy_global_to_shared(x_desc, [off_m, k * BK], ready.index(s), x_smem.index(s))


@gluon.jit
def _ws_mma(w_smem, x_smem, ready, empty, ws_ptr, xs_ptr, y_ptr, off_n, off_m, M, N, nk,
            BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BM, 32])
    acc = gl.zeros((BN, BM), gl.float32, layout)
    for k in range(nk):
        s = k % STAGES
        mbarrier.wait(ready.index(s), (k // STAGES) & 1)
        acc = warpgroup_mma(w_smem.index(s), x_smem.index(s).permute((1, 0)), acc, is_async=True)
        acc, _, _ = warpgroup_mma_wait(num_outstanding=1,
                                       deps=(acc, w_smem.index(s), x_smem.index(s)))
        mbarrier.arrive(empty.index((k + STAGES - 1) % STAGES), count=1, pred=k > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    rows = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    cols = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    acc = acc * gl.load(ws_ptr + rows)[:, None]
    acc = acc * gl.load(xs_ptr + cols, mask=cols < M, other=0.0)[None, :]
    ptrs = y_ptr + cols[None, :].to(gl.int64) * N + rows[:, None]
    gl.store(ptrs, acc.to(gl.bfloat16), mask=(cols < M)[None, :] & (rows < N)[:, None])


@gluon.jit
def w8a8_ws(w_desc, x_desc, ws_ptr, xs_ptr, y_ptr, M, N, K,
            BN: gl.constexpr, BM: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
            num_warps: gl.constexpr):
    tiles_m = gl.cdiv(M, BM)
    pid = gl.program_id(0)
    off_m = (pid % tiles_m) * BM
    off_n = (pid // tiles_m) * BN
    w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BN, BK], w_desc.layout)
    x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, BK], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    nk = gl.cdiv(K, BK)
    gl.warp_specialize([
        (_ws_mma, (w_smem, x_smem, ready, empty, ws_ptr, xs_ptr, y_ptr, off_n, off_m, M, N, nk,
                   BN, BM, STAGES, num_warps)),
        (_ws_loader, (w_desc, x_desc, w_smem, x_smem, ready, empty, off_n, off_m, nk, BK,
                      STAGES)),
    ], [1], [24])


def run_ws(xq, xs, w, ws, bm, bn=64, bk=128, stages=4):
    m, k = xq.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=torch.bfloat16, device=w.device)
    wl = gl.NVMMASharedLayout.get_default_for([bn, bk], gl.float8e4nv)
    xl = gl.NVMMASharedLayout.get_default_for([bm, bk], gl.float8e4nv)
    wd = TensorDescriptor.from_tensor(w, [bn, bk], wl)
    xd = TensorDescriptor.from_tensor(xq, [bm, bk], xl)
    w8a8_ws[(triton.cdiv(m, bm) * (n // bn),)](wd, xd, ws, xs, y, m, n, k, BN=bn, BM=bm, BK=bk,
                                                 STAGES=stages, num_warps=4)
    return y


def run(xq, xs, w, ws, bm, bn=64, bk=128, stages=4):
    m, k = xq.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=torch.bfloat16, device=w.device)
    wl = gl.NVMMASharedLayout.get_default_for([bn, bk], gl.float8e4nv)
    xl = gl.NVMMASharedLayout.get_default_for([bm, bk], gl.float8e4nv)
    wd = TensorDescriptor.from_tensor(w, [bn, bk], wl)
    xd = TensorDescriptor.from_tensor(xq, [bm, bk], xl)
    w8a8_gl[(triton.cdiv(m, bm) * (n // bn),)](wd, xd, ws, xs, y, m, n, k, BN=bn, BM=bm, BK=bk,
                                                STAGES=stages, num_warps=4)
    return y


def main():
    from bench_gemv import L2_FLUSH_BYTES, time_graph
    from minisgl.kernel.triton.fp8_quant import quantize_tokens
    from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm, pick_config
    from minisgl.quant.fp8 import quantize_channel

    layers = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096),
              "down": (4096, 12288)}
    res = []
    for name, (n, k) in layers.items():
        copies = max(2, min(64, L2_FLUSH_BYTES // (n * k)))
        ws = [quantize_channel(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02)
              for _ in range(copies)]
        for m in (16, 64, 128, 256):
            xq, xs = quantize_tokens(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
            ref = fp8_w8a8_gemm(xq, xs, *ws[0])
            t_tr = time_graph(lambda a, w: fp8_w8a8_gemm(a[0], a[1], *w), ws, (xq, xs))
            cfg = pick_config(m, n, k, x_bytes=1)
            rec = dict(layer=name, m=m, triton_us=round(t_tr * 1e6, 2),
                       triton_cfg=(cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages))
            for bm in sorted({min(128, max(16, m)), cfg.block_m}):
                for fn, bk, st in ((run, 256, 4), (run_ws, 128, 6), (run_ws, 128, 8),
                                   (run_ws, 256, 3), (run_ws, 256, 4)):
                    if (64 + bm) * bk * st > 200 * 1024:
                        continue
                    try:
                        y = fn(xq, xs, ws[0][0], ws[0][1], bm, 64, bk, st)
                        err = ((y.float() - ref.float()).abs().max()
                               / ref.float().abs().max()).item()
                        t = time_graph(lambda a, w: fn(a[0], a[1], w[0], w[1], bm, 64, bk, st),
                                       ws, (xq, xs))
                        rec[str((fn.__name__, bm, bk, st))] = (round(t * 1e6, 2), round(err, 4))
                    except Exception as e:  # noqa: BLE001
                        rec[str((fn.__name__, bm, bk, st))] = f"{type(e).__name__}: {str(e)[:300]}"
            res.append(rec)
            print(json.dumps(rec), flush=True)
        del ws
        torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "probe_w8a8_gluon.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "smoke":
        from minisgl.kernel.triton.fp8_quant import quantize_tokens
        from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm
        from minisgl.quant.fp8 import quantize_channel
        w, s = quantize_channel(torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16))
        xq, xs = quantize_tokens(torch.randn(100, 4096, device="cuda", dtype=torch.bfloat16))
        ref = fp8_w8a8_gemm(xq, xs, w, s)
        for fn in (run, run_ws):
            y = fn(xq, xs, w, s, 64)
            print(fn.__name__, "smoke err",
                  ((y.float() - ref.float()).abs().max() / ref.float().abs().max()).item())
    else:
        main()
