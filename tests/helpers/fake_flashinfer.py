"""A stand-in for the ``flashinfer`` module on CPU: its two paged wrappers, in plain torch.

It computes what FlashInfer's documentation says the wrappers compute from
``(qo_indptr, kv_indptr, kv_indices, last_page_len)`` (causal masks aligned to the end of each
request's context, ``window_left`` keys to the left of a query plus its own, soft-capped scaled
scores, K/V scales), so a test of ``FlashInferBackend`` with it checks the backend's plumbing (the
page ids it gathers, the arguments it plans with, the CUDA-graph buffers it refills) against the
torch reference backend. Its methods take the keyword names of flashinfer 0.6, and no others, so
a misspelt argument fails here too. It says nothing about FlashInfer's kernels: the GPU tests do.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch._subclasses.fake_tensor import is_fake

__version__ = "fake"


def _real(*tensors) -> None:
    """FlashInfer's C++ reads the memory of what it is handed: a fake tensor (a warm-up's shadow
    run) has none, and the real library crashes the process on it."""
    assert not any(isinstance(t, torch.Tensor) and is_fake(t) for t in tensors), \
        "flashinfer was handed a fake tensor: the real library would crash the process"


class _Paged:
    """The state ``plan`` leaves and ``run`` reads (device copies, or the graph buffers)."""

    def __init__(self, use_cuda_graph: bool, indptr_buf=None, indices_buf=None,
                 last_buf=None) -> None:
        self.use_cuda_graph = use_cuda_graph
        self.bufs = (indptr_buf, indices_buf, last_buf)
        self.planned = False
        self.plans = 0

    def _store(self, qo_indptr, kv_indptr, kv_indices, last_page_len, num_qo_heads,
               num_kv_heads, head_dim, page_size, causal, sm_scale, window_left,
               logits_soft_cap, q_data_type, kv_data_type):
        _real(qo_indptr, kv_indptr, kv_indices, last_page_len)
        assert qo_indptr.device.type == "cpu" and kv_indptr.device.type == "cpu", \
            "plan reads the indptrs on the host: hand it host tensors"
        assert kv_indptr.dtype == last_page_len.dtype == kv_indices.dtype == torch.int32
        assert int(kv_indptr[-1]) == len(kv_indices)
        if self.use_cuda_graph:
            indptr_buf, indices_buf, last_buf = self.bufs
            assert len(kv_indptr) == len(indptr_buf), "graph mode: the batch size is fixed"
            assert len(kv_indices) <= len(indices_buf)
            indptr_buf.copy_(kv_indptr)
            last_buf.copy_(last_page_len)
            indices_buf[: len(kv_indices)].copy_(kv_indices)
        else:
            self.bufs = (kv_indptr.clone(), kv_indices.clone(), last_page_len.clone())
        self.qo_indptr = qo_indptr.clone()
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        self.page_size, self.causal = page_size, causal
        self.sm_scale = head_dim**-0.5 if sm_scale is None else sm_scale
        self.window_left, self.softcap = window_left, logits_soft_cap
        self.dtypes = (q_data_type, kv_data_type)
        self.planned = True
        self.plans += 1

    def _run(self, q, paged_kv_cache, k_scale, v_scale, out):
        assert self.planned, "run before plan"
        assert q.dtype == self.dtypes[0] and paged_kv_cache[0].dtype == self.dtypes[1]
        assert q.shape[0] == int(self.qo_indptr[-1]), "q must have qo_indptr[-1] rows"
        assert q.shape[1:] == (self.heads[0], self.heads[2])
        k_pages, v_pages = paged_kv_cache
        assert k_pages.shape[1:] == (self.page_size, self.heads[1], self.heads[2])
        indptr, indices, last = (b.cpu() for b in self.bufs)
        page = self.page_size
        res = torch.empty(q.shape, dtype=torch.float32)
        for b in range(len(last)):
            pages = indices[int(indptr[b]) : int(indptr[b + 1])].long()
            kv_len = (len(pages) - 1) * page + int(last[b])
            slots = (pages[:, None] * page + torch.arange(page)).flatten()[:kv_len]
            k = k_pages.reshape(-1, *k_pages.shape[2:])[slots.to(k_pages.device)].float().cpu()
            v = v_pages.reshape(-1, *v_pages.shape[2:])[slots.to(v_pages.device)].float().cpu()
            lo, hi = int(self.qo_indptr[b]), int(self.qo_indptr[b + 1])
            qb = q[lo:hi].float().cpu()
            group = qb.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            s = torch.einsum("thd,shd->hts", qb, k) * self.sm_scale * (k_scale or 1.0)
            if self.softcap:
                s = torch.tanh(s / self.softcap) * self.softcap
            pos = kv_len - (hi - lo) + torch.arange(hi - lo)  # each query's own position
            key = torch.arange(kv_len)
            mask = torch.ones(hi - lo, kv_len, dtype=torch.bool)
            if self.causal:
                mask &= key[None, :] <= pos[:, None]
            if self.window_left >= 0:
                mask &= key[None, :] >= pos[:, None] - self.window_left
            s = s.masked_fill(~mask, float("-inf"))
            res[lo:hi] = torch.einsum("hts,shd->thd", s.softmax(-1), v) * (v_scale or 1.0)
        out = torch.empty_like(q) if out is None else out
        out.copy_(res.to(out.dtype))
        return out


class BatchPrefillWithPagedKVCacheWrapper(_Paged):
    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False) -> None:
        assert kv_layout == "NHD"
        super().__init__(use_cuda_graph)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, non_blocking=True) -> None:
        self._store(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                    num_qo_heads, num_kv_heads, head_dim_qk, page_size, causal, sm_scale,
                    window_left, logits_soft_cap, q_data_type, kv_data_type or q_data_type)

    def run(self, q, paged_kv_cache, *, q_scale=None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, out=None, lse=None, return_lse=False,
            enable_pdl=None, window_left=None, sinks=None):
        assert sinks is None and window_left is None
        _real(q, *paged_kv_cache)
        return self._run(q, paged_kv_cache, k_scale, v_scale, out)


class BatchDecodeWithPagedKVCacheWrapper(_Paged):
    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, backend: str = "auto") -> None:
        assert kv_layout == "NHD"
        if use_cuda_graph:
            assert all(b is not None for b in (paged_kv_indptr_buffer, paged_kv_indices_buffer,
                                               paged_kv_last_page_len_buffer))
        super().__init__(use_cuda_graph, paged_kv_indptr_buffer, paged_kv_indices_buffer,
                         paged_kv_last_page_len_buffer)
        self.use_tensor_cores = use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
             page_size, *, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             q_data_type="float16", kv_data_type=None, data_type=None, sm_scale=None,
             rope_scale=None, rope_theta=None, non_blocking=True) -> None:
        qo = torch.arange(len(last_page_len) + 1, dtype=torch.int32)
        self._store(qo, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                    page_size, False, sm_scale, window_left, logits_soft_cap, q_data_type,
                    kv_data_type or q_data_type)

    def run(self, q, paged_kv_cache, *, q_scale=None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, out=None, lse=None, return_lse=False,
            enable_pdl=None, window_left=None, sinks=None):
        assert sinks is None and window_left is None
        _real(q, *paged_kv_cache)
        return self._run(q, paged_kv_cache, k_scale, v_scale, out)
