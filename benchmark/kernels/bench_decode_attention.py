"""Paged Triton decode attention vs dense SDPA (FlashAttention / cuDNN) on contiguous K/V, bf16,
and FlashInfer's paged decode on the same pages when flashinfer is installed.

    python benchmark/kernels/bench_decode_attention.py [--batch 1 32 256]
        [--ctx 512 1024 4096 16384] [--models ...] [--sweep] [--prefill] [--no-fi] [--out DIR]

Per (batch, context, model shape): our kernel reads K/V through a shuffled page table (page size 1,
every token in a random slot); the reference is ``scaled_dot_product_attention`` on contiguous
``[B, Hkv, S, D]`` K/V with the GQA group packed as query rows (``q [B, Hkv, group, D]``: each K/V
byte read once, as in our kernel), timed under the flash and the cuDNN backends; the faster one is
the reference. TB/s = bytes of K+V read / median time (``triton.testing.do_bench``, L2 flushed
between runs). ``--sweep`` times launch configurations and split counts on a few cases (to tune
``_launch_config`` / ``choose_num_splits``); ``--prefill`` times the extend kernel against
FlashAttention varlen for prefill. FlashInfer (``fi`` columns): its
``BatchDecodeWithPagedKVCacheWrapper`` over the same page table (page size 1), planned once per
input copy outside the graph, as
``--attn fi`` plans once per step (tensor cores for GQA groups of 4 and more, as the backend
chooses; ``fi cc``: the same on CUDA cores, where the backend chose tensor cores for bf16 K/V);
``--prefill`` adds its paged prefill wrapper. Writes
``<date>_decode_attention_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import re
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))

import triton
from decode_attention_fi import fi_decode_fns, fi_module, fi_prefill_ms, fi_tensor_cores
from decode_attention_report import write
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from minisgl.kernel.triton.decode_attention import choose_num_splits, decode_attention
from minisgl.kernel.triton.extend_attention import extend_attention

MODELS = {  # (q heads, kv heads, head_dim); Gemma 4 26B-A4B's sliding and global layers
    "Qwen3-0.6B": (16, 8, 128), "Qwen3-8B": (32, 8, 128),
    "Gemma-4-sliding": (16, 8, 256), "Gemma-4-global": (16, 2, 512)}
SWEEP_CFG = [(64, 4, 3), (128, 4, 2)]  # (block_n, warps, stages)
# heads wider than 128: _launch_config's 32/4/2 beside fewer rows or more warps a program
# (register use at these heads: docs/performance.md, Gemma 4)
SWEEP_CFG_WIDE = [(32, 4, 2), (16, 4, 2), (16, 4, 3), (32, 8, 2), (32, 8, 3), (16, 8, 2),
                  (64, 8, 2)]
SWEEP_CFG_FP8 = [(64, 4, 3), (128, 4, 2), (128, 4, 3), (128, 8, 2), (128, 8, 3), (256, 8, 2),
                 (64, 4, 4), (64, 2, 3)]
ROTATE_BYTES = 256 << 20  # small cases rotate over copies of this many bytes: L2 is 50 MB


def make_cache(bs: int, ctx: int, hkv: int, dim: int):
    """Dense K/V and the same values scattered to random slots of a paged pool."""
    n = bs * ctx
    k = torch.randn(bs, hkv, ctx, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(bs, hkv, ctx, dim, device="cuda", dtype=torch.bfloat16)
    perm = torch.randperm(n, device="cuda")
    k_cache = torch.empty(n, hkv, dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.empty_like(k_cache)
    k_cache[perm] = k.permute(0, 2, 1, 3).reshape(n, hkv, dim)
    v_cache[perm] = v.permute(0, 2, 1, 3).reshape(n, hkv, dim)
    table = perm.to(torch.int32).view(bs, ctx)
    return k, v, k_cache, v_cache, table


def graph_ms(fns, backend=None) -> float | None:
    """Median time of one call, replaying a CUDA graph of all ``fns`` (one per input copy)."""
    ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
    try:
        with ctx:
            for fn in fns:
                fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for fn in fns:
                    fn()
        return do_bench(graph.replay, return_mode="median") / len(fns)
    except RuntimeError as exc:  # this SDPA backend does not take the shape
        print(f"  {backend}: {str(exc)[:120]}", flush=True)
        return None


def eager_ms(fn, backend=None) -> float | None:
    ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
    try:
        with ctx:
            return do_bench(fn, return_mode="median")
    except RuntimeError:
        return None


def run_case(bs, ctx, copies, model, cache, num_sms, sweep, fi=None) -> dict:
    hq, hkv, dim = MODELS[model]
    k, v, k_cache, v_cache, table = cache
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    q = torch.randn(bs, hq, dim, device="cuda", dtype=torch.bfloat16)
    qp = q.view(bs, hkv, hq // hkv, dim)  # the GQA group as query rows: one read of each K/V
    rows = [torch.arange(i * bs, (i + 1) * bs, device="cuda", dtype=torch.int32)
            for i in range(copies)]
    lens = torch.full((bs,), ctx, device="cuda", dtype=torch.int32)
    splits = choose_num_splits(bs, hkv, ctx, num_sms)

    def ours(i=0, s=splits, **launch):
        return decode_attention(q, k_cache, v_cache, table, rows[i], lens, dim**-0.5, s, **launch)

    def ref(i=0):
        return F.scaled_dot_product_attention(qp, k[i * bs : (i + 1) * bs],
                                              v[i * bs : (i + 1) * bs])

    err = (ours().float() - ref().reshape(bs, hq, dim).float()).abs().max().item()
    nbytes = 2 * bs * ctx * hkv * dim * k_cache.element_size()
    fns = lambda f, **kw: [functools.partial(f, i, **kw) for i in range(copies)]  # noqa: E731
    t = dict(ours=graph_ms(fns(ours)), flash=graph_ms(fns(ref), SDPBackend.FLASH_ATTENTION),
             cudnn=graph_ms(fns(ref), SDPBackend.CUDNN_ATTENTION))
    # None: neither takes the shape (FlashAttention's heads stop at 256)
    t_ref = min((x for x in (t["flash"], t["cudnn"]) if x is not None), default=None)
    row = dict(model=model, batch=bs, ctx=ctx, splits=splits, copies=copies, max_abs_err=err,
               ours_ms=t["ours"], flash_ms=t["flash"], cudnn_ms=t["cudnn"],
               ours_tbps=nbytes / t["ours"] / 1e9,
               ref_tbps=nbytes / t_ref / 1e9 if t_ref else None,
               ratio=t_ref / t["ours"] if t_ref else None,
               eager_ours_ms=eager_ms(ours),
               eager_flash_ms=eager_ms(ref, SDPBackend.FLASH_ATTENTION),
               eager_cudnn_ms=eager_ms(ref, SDPBackend.CUDNN_ATTENTION))
    if fi is not None:
        fns_fi = fi_decode_fns(fi, q, k_cache, v_cache, table, rows, ctx, dim**-0.5)
        got = fns_fi[0]().float()
        row["fi_max_abs_err"] = (got - ref().reshape(bs, hq, dim).float()).abs().max().item()
        row["fi_ms"] = graph_ms(fns_fi)
        row["fi_tbps"] = nbytes / row["fi_ms"] / 1e9
        row["fi_vs_ours"] = row["ours_ms"] / row["fi_ms"]  # > 1: FlashInfer faster
        row["eager_fi_ms"] = eager_ms(fns_fi[0])
        if fi_tensor_cores(q, k_cache) and not fp8:  # the CUDA-core decode beside the choice
            fns_cc = fi_decode_fns(fi, q, k_cache, v_cache, table, rows, ctx, dim**-0.5,
                                   tensor_cores=False)
            row["fi_cc_ms"] = graph_ms(fns_cc)
    torch.cuda.synchronize()
    tic = time.perf_counter()
    for _ in range(100):
        ours()
    row["host_us_per_call"] = (time.perf_counter() - tic) * 1e4  # launch cost, unsynchronised
    torch.cuda.synchronize()
    if sweep:
        row["sweep"] = []
        cands = [x for x in (1, 2, 3, 4, 8, 16, 32, 64) if splits / 4 <= x <= splits * 4]
        for s in cands:
            for bn, w, st in SWEEP_CFG_FP8 if fp8 else SWEEP_CFG_WIDE if dim > 128 else SWEEP_CFG:
                ms = graph_ms(fns(ours, s=s, block_n=bn, num_warps=w, num_stages=st))
                row["sweep"].append(dict(splits=s, block_n=bn, warps=w, stages=st, ms=ms,
                                         tbps=nbytes / ms / 1e9))
        best = min(row["sweep"], key=lambda r: r["ms"])
        print(f"  sweep best ({model}, B={bs}, ctx={ctx}; default {row['ours_ms'] * 1e3:.1f} us):"
              f" {best}", flush=True)
    return row


EXTEND_CFG = [(64, 64, 4, 3), (128, 32, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3), (64, 32, 4, 4),
              (128, 64, 4, 2)]  # (block_m, block_n, warps, stages)


def prefill_bench(sweep: bool, fi=None) -> list[dict]:
    """Extend kernel vs FlashAttention varlen (no prefix; alone with one), Qwen3-8B heads; and
    FlashInfer's paged prefill when given."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    from minisgl.attention.fa_backend import find_varlen

    impl, varlen = find_varlen()
    hq, hkv, dim = MODELS["Qwen3-8B"]
    out = []
    for bs, ext, prefix in [(1, 8192, 0), (8, 1024, 0), (32, 256, 0), (8, 1024, 3072)]:
        n = bs * (ext + prefix)
        q = torch.randn(bs * ext, hq, dim, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(n, hkv, dim, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        table = torch.randperm(n, device="cuda").to(torch.int32).view(bs, ext + prefix)
        rows = torch.arange(bs, device="cuda", dtype=torch.int32)
        lens = torch.full((bs,), ext + prefix, device="cuda", dtype=torch.int32)
        cu = torch.arange(0, bs * ext + 1, ext, device="cuda", dtype=torch.int32)
        args = (q, kc, vc, table, rows, cu, lens, ext, dim**-0.5)
        t_ext = do_bench(lambda args=args: extend_attention(*args), return_mode="median")
        flops = 4 * bs * hq * dim * (ext * prefix + ext * ext / 2)
        row = dict(batch=bs, extend=ext, prefix=prefix, triton_ms=t_ext, fa_impl=impl,
                   triton_tflops=flops / t_ext / 1e9)
        if fi is not None:
            t_fi, got_fi = fi_prefill_ms(fi, *args[:4], bs, ext, prefix, dim**-0.5)
            got = extend_attention(*args)
            row.update(fi_ms=t_fi, fi_tflops=flops / t_fi / 1e9,
                       fi_max_abs_diff=(got_fi.float() - got.float()).abs().max().item())
        if sweep:
            row["sweep"] = [
                dict(cfg=c, ms=do_bench(lambda c=c, args=args: extend_attention(
                    *args, block_m=c[0], block_n=c[1], num_warps=c[2], num_stages=c[3]),
                    return_mode="median"))
                for c in EXTEND_CFG
            ]
        if prefix == 0:
            k_new = kc[table.view(-1).long()]
            v_new = vc[table.view(-1).long()]
            fa_args = (q, k_new, v_new, cu, ext, dim**-0.5)
            t_fa = do_bench(lambda fa_args=fa_args: varlen(*fa_args), return_mode="median")
            ref = varlen(q, k_new, v_new, cu, ext, dim**-0.5)
            got = extend_attention(q, kc, vc, table, rows, cu, lens, ext, dim**-0.5)
            row.update(fa_ms=t_fa, fa_tflops=flops / t_fa / 1e9,
                       max_abs_err=(ref.float() - got.float()).abs().max().item())
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 256])
    p.add_argument("--ctx", type=int, nargs="+", default=[512, 1024, 4096, 16384])
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--prefill", action="store_true")
    p.add_argument("--kv-dtype", choices=["bf16", "fp8"], default="bf16",
                   help="fp8: the paged K/V in e4m3 (scale 1; the reference keeps bf16)")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=["Qwen3-0.6B", "Qwen3-8B"],
                   help="attention shapes (Gemma-4-*: heads of 256 and 512)")
    p.add_argument("--no-fi", action="store_true", help="leave FlashInfer's columns out")
    p.add_argument("--out", default="bench-out", help="results (./bench-out)")
    a = p.parse_args()
    fi = None if a.no_fi else fi_module()
    gpu = torch.cuda.get_device_name()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    results, start = [], time.time()
    kv_shapes = sorted({MODELS[m][1:] for m in a.models})  # one cache serves each (Hkv, D)
    for bs in a.batch:
        for ctx in a.ctx:
            for hkv, dim in kv_shapes:
                kv_bytes = 2 * bs * ctx * hkv * dim * 2
                copies = max(1, min(64, ROTATE_BYTES // kv_bytes))
                need = 2 * kv_bytes * copies * 1.3  # dense + paged K and V, + the scatter's temp
                if need > torch.cuda.mem_get_info()[0]:
                    print(f"skip B={bs} ctx={ctx} D={dim}: needs {need / 2**30:.1f} GiB",
                          flush=True)
                    continue
                cache = make_cache(bs * copies, ctx, hkv, dim)
                if a.kv_dtype == "fp8":
                    cache = (*cache[:2], cache[2].to(torch.float8_e4m3fn),
                             cache[3].to(torch.float8_e4m3fn), cache[4])
                for model in (m for m in a.models if MODELS[m][1:] == (hkv, dim)):
                    sweep = a.sweep and ctx in (1024, 16384) and (
                        model != "Qwen3-0.6B" or a.kv_dtype == "fp8")
                    row = run_case(bs, ctx, copies, model, cache, num_sms, sweep, fi)
                    print(json.dumps({k: v for k, v in row.items() if k != "sweep"}), flush=True)
                    results.append(row)
                del cache
                torch.cuda.empty_cache()
    prefill = []
    if a.prefill:
        try:
            prefill = prefill_bench(a.sweep, fi)
        except Exception as exc:  # e.g. no FlashAttention here: keep the decode results
            print(f"prefill bench failed: {type(exc).__name__}: {exc}", flush=True)
    date = datetime.date.today().isoformat()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    meta = dict(gpu=gpu, date=date, torch=torch.__version__, triton=triton.__version__,
                flashinfer=getattr(fi, "__version__", None), num_sms=num_sms, dtype="bfloat16",
                page_size=1, seconds=time.time() - start)
    os.makedirs(a.out, exist_ok=True)
    stem = os.path.join(a.out, f"{date}_decode_attention_{slug}"
                        + ("_fp8" if a.kv_dtype == "fp8" else ""))
    write(stem, meta, results, prefill, fi)


if __name__ == "__main__":
    main()
