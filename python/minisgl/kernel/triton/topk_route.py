"""The MoE router's top-k in one launch (``layers.moe.MoE.route`` on CUDA): torch's ``topk``
then ``softmax`` take four kernels a layer (a gather, a sort, a reduction, the softmax), more than
the experts' own GEMMs at batch 1.

One program takes ``BLOCK_T`` tokens' logits (all experts in one tile), picks the largest k times
(the lowest expert id among equal logits; NaN above every number, as in ``torch.topk``), and
writes the weights (float32, or the experts' input dtype, saving the cast's launch) and the ids,
largest first as ``torch.topk`` does:

- ``SOFTMAX_FIRST`` (Qwen's ``softmax`` routing): softmax over every expert, the top k of it,
  renormalised to sum 1 when ``RENORMALIZE``;
- else (gpt-oss's ``topk_softmax``): the top k logits, softmax over them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .pdl import wait_then_release


@triton.jit
def pick_topk(x, experts, n_experts, K: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_E: tl.constexpr, SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr):
    """Logits x [BLOCK_T, BLOCK_E] (float32; lanes from ``n_experts`` on any value) -> the
    routing weights and expert ids [BLOCK_T, K], largest first (the module docstring)."""
    valid = (experts < n_experts)[None, :]
    x = tl.where(valid, x, -float("inf"))
    if SOFTMAX_FIRST:
        x = tl.exp(x - tl.max(x, axis=1)[:, None])
        x = x / tl.sum(x, axis=1)[:, None]
    # NaN ranks above every number, as in torch.topk: a row of NaN (a padding row's garbage)
    # still picks experts that exist, never the tile's padding
    x = tl.where(valid, tl.where(x == x, x, float("inf")), -float("inf"))
    cols = tl.arange(0, K)
    vals = tl.zeros((BLOCK_T, K), dtype=tl.float32)
    ids = tl.zeros((BLOCK_T, K), dtype=tl.int32)
    for j in tl.static_range(K):
        best = tl.max(x, axis=1)
        pick = tl.min(tl.where(x == best[:, None], experts[None, :], BLOCK_E), axis=1)
        vals = tl.where(cols[None, :] == j, best[:, None], vals)
        ids = tl.where(cols[None, :] == j, pick[:, None], ids)
        x = tl.where(experts[None, :] == pick[:, None], -float("inf"), x)
    if SOFTMAX_FIRST:
        if RENORMALIZE:
            vals = vals / tl.sum(vals, axis=1)[:, None]
    else:
        vals = tl.exp(vals - tl.max(vals, axis=1)[:, None])
        vals = vals / tl.sum(vals, axis=1)[:, None]
    return vals, ids


@triton.jit
def store_topk(weights_ptr, ids_ptr, toks, t_ok, vals, ids, K: tl.constexpr):
    """Tokens ``toks``' weights and ids [T, K] (``pick_topk``'s), where ``t_ok``."""
    out = toks[:, None] * K + tl.arange(0, K)[None, :]
    tl.store(weights_ptr + out, vals.to(weights_ptr.dtype.element_ty), mask=t_ok[:, None])
    tl.store(ids_ptr + out, ids.to(ids_ptr.dtype.element_ty), mask=t_ok[:, None])


@triton.jit(do_not_specialize=["n_tokens"])
def _topk_route_kernel(logits_ptr, weights_ptr, ids_ptr, n_tokens, n_experts, stride_t,
                       K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                       SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr,
                       USE_PDL: tl.constexpr):
    wait_then_release(USE_PDL)
    toks = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.arange(0, BLOCK_E)
    t_ok = toks < n_tokens
    x = tl.load(logits_ptr + tl.where(t_ok, toks, 0)[:, None].to(tl.int64) * stride_t
                + experts[None, :], mask=(experts < n_experts)[None, :])
    # rows past n_tokens repeat row 0 and are never stored
    vals, ids = pick_topk(x.to(tl.float32), experts, n_experts, K, BLOCK_T, BLOCK_E,
                          SOFTMAX_FIRST, RENORMALIZE)
    store_topk(weights_ptr, ids_ptr, toks, t_ok, vals, ids, K)


def topk_route(logits: torch.Tensor, k: int, softmax_first: bool, renormalize: bool = False,
               dtype: torch.dtype = torch.float32, pdl: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k] in ``dtype``, computed in float32; ids [T, k] int64);
    see the module docstring. ``k`` must be a power of two (the tile's width): callers fall back
    to torch otherwise. ``pdl``: ``pdl.py``."""
    assert logits.stride(1) == 1 and k & (k - 1) == 0
    n_tokens, n_experts = logits.shape
    weights = torch.empty(n_tokens, k, dtype=dtype, device=logits.device)
    ids = torch.empty(n_tokens, k, dtype=torch.int64, device=logits.device)
    block_e = triton.next_power_of_2(n_experts)
    block_t = max(1, min(16, 4096 // block_e))
    _topk_route_kernel[(triton.cdiv(n_tokens, block_t),)](
        logits, weights, ids, n_tokens, n_experts, logits.stride(0), K=k, BLOCK_T=block_t,
        BLOCK_E=block_e, SOFTMAX_FIRST=softmax_first, RENORMALIZE=renormalize,
        **pdl_.launch_options(logits, pdl))
    return weights, ids
