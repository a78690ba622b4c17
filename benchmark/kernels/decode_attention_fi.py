"""FlashInfer's side of ``bench_decode_attention.py`` (its ``fi`` columns): the paged decode and
prefill wrappers planned over the benchmark's own page table (page size 1: a page per slot), all
on one workspace. ``fi_module`` is None where flashinfer is not installed."""

from __future__ import annotations

import functools

import torch
from triton.testing import do_bench


def fi_module():
    """flashinfer, or None (its columns are left out)."""
    try:
        import flashinfer
    except ImportError as exc:
        print(f"no fi columns: {exc}", flush=True)
        return None
    return flashinfer


_FI_WORKSPACE: list[torch.Tensor] = []


def fi_workspace() -> torch.Tensor:
    if not _FI_WORKSPACE:
        _FI_WORKSPACE.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    return _FI_WORKSPACE[0]


def fi_tensor_cores(q, k_cache) -> bool:
    """The backend's choice (``attention/fi_backend.py``): FP8 K/V or a GQA group of 4 or more."""
    return k_cache.dtype != q.dtype or q.shape[1] // k_cache.shape[1] >= 4


def fi_decode_fns(fi, q, k_cache, v_cache, table, rows, ctx, scale,
                  tensor_cores: bool | None = None) -> list:
    """One planned FlashInfer decode per input copy (page size 1: a page per slot);
    ``tensor_cores``: None for the backend's choice."""
    bs, hq, dim = q.shape
    hkv = k_cache.shape[1]
    if tensor_cores is None:
        tensor_cores = fi_tensor_cores(q, k_cache)
    pages = (k_cache.view(-1, 1, hkv, dim), v_cache.view(-1, 1, hkv, dim))
    indptr = torch.arange(0, (bs + 1) * ctx, ctx, dtype=torch.int32)
    last = torch.ones(bs, dtype=torch.int32)
    fns = []
    for r in rows:
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
            fi_workspace(), "NHD", use_tensor_cores=tensor_cores)
        wrapper.plan(indptr, table[r.long()].reshape(-1), last, hq, hkv, dim, 1, sm_scale=scale,
                     q_data_type=q.dtype, kv_data_type=k_cache.dtype)
        out = torch.empty_like(q)
        fns.append(functools.partial(wrapper.run, q, pages, out=out))
    return fns


def fi_prefill_ms(fi, q, kc, vc, table, bs, ext, prefix, scale) -> tuple[float, torch.Tensor]:
    """FlashInfer's paged prefill (page size 1) of the same batch: median ms, its output."""
    hkv, dim = kc.shape[1], kc.shape[2]
    n = ext + prefix
    wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(fi_workspace(), "NHD")
    wrapper.plan(torch.arange(0, (bs + 1) * ext, ext, dtype=torch.int32),
                 torch.arange(0, (bs + 1) * n, n, dtype=torch.int32), table.reshape(-1),
                 torch.ones(bs, dtype=torch.int32), q.shape[1], hkv, dim, 1, causal=True,
                 sm_scale=scale, q_data_type=q.dtype, kv_data_type=kc.dtype)
    pages = (kc.view(-1, 1, hkv, dim), vc.view(-1, 1, hkv, dim))
    out = torch.empty_like(q)
    run = functools.partial(wrapper.run, q, pages, out=out)
    return do_bench(run, return_mode="median"), run()
