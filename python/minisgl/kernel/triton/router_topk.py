"""The MoE router's linear layer and its top-k in one launch, for decode steps of up to 256 tokens.
Correct on the H200 but slower there than the two launches it would replace (``MoELayer`` keeps
those; ``benchmark/kernels/bench_router.py``, docs/performance.md): kept to be profiled.

At batch 1 the router is two dependent launches a layer (a GEMV over a few programs, then
``topk_route``): the few programs read the router's weight [E, H] in dependent chunks, and the
top-k waits for them to finish; from two tokens on, a cuBLAS GEMM (split over K, with a reduction
kernel of its own) then the top-k. Here the grid is slices of H by blocks of 16 tokens: each
program loads its ``BLOCK_K`` slice of the weight before the PDL wait (no kernel writes it),
multiplies its tokens' slice of x by it (``tl.dot``, float32 sums) and stores its partial logits
[16, E] (float32) in a workspace. A ticket counter a token block says which of the block's
programs finishes last (each program's partials stored, then a CTA barrier and one
acquire-release increment, the order of CUTLASS's split-K semaphore); that program sums the
block's partials in slice order (the same sums in the same order every call), adds the bias,
rounds the logits to x's dtype as the linear layer's output is rounded, picks the top k
(``topk_route.pick_topk``) and sets the ticket back to zero for the next call, so a captured
graph replays it as it is.

Gemma 4's router scales join it too (``in_scale``, ``in_mult``, ``expert_scale``): x's slice times
the learned ``router_scale`` and times ``hidden ** -0.5``, each product rounded to x's dtype as
torch's two multiplies round it, and the picked weights times their experts' scales (float32,
as torch's multiply of the float32 weights promotes): five launches of torch a layer fewer.

``router_workspace`` allocates a layer's partials and tickets (per layer: two engines on one
device never share one); ``fits`` says whether a batch takes this path (``max_tokens``: 256
tokens at 32 experts, fewer with more, and a tile of partials that fits in the registers of 16
warps).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .pdl import wait_then_release
from .topk_route import pick_topk, store_topk

BLOCK_T = 16  # a program's tokens
BLOCK_K = 256
MAX_TILE = 32768  # a tile's elements (partials: slices x 16 x experts; the weight's slice)
MAX_PARTIALS = 8192  # tokens x experts of a layer's workspace (32 experts: 256 tokens)


@triton.jit(do_not_specialize=["n_tokens"])
def _router_topk_kernel(x_ptr, w_ptr, b_ptr, part_ptr, ticket_ptr, weights_ptr, ids_ptr,
                        in_scale_ptr, es_ptr, n_tokens, n_experts, hidden, stride_x, in_mult,
                        K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                        BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr, HAS_BIAS: tl.constexpr,
                        IN_SCALE: tl.constexpr, EXPERT_SCALE: tl.constexpr,
                        SOFTMAX_FIRST: tl.constexpr, RENORMALIZE: tl.constexpr,
                        USE_PDL: tl.constexpr):
    s = tl.program_id(0)
    n_slices = tl.num_programs(0)
    block = tl.program_id(1)  # the token block: its partials and ticket
    part_ptr += block * n_slices * (BLOCK_T * BLOCK_E)
    ticket_ptr += block
    experts = tl.arange(0, BLOCK_E)
    e_ok = experts < n_experts
    ks = s * BLOCK_K + tl.arange(0, BLOCK_K)
    k_ok = ks < hidden
    # no kernel writes the router's weight: its slice is asked for before the wait
    w = tl.load(w_ptr + experts[:, None] * hidden + ks[None, :],
                mask=e_ok[:, None] & k_ok[None, :], other=0.0)
    wait_then_release(USE_PDL)
    rows = tl.arange(0, BLOCK_T)
    toks = block * BLOCK_T + rows
    t_ok = toks < n_tokens
    x = tl.load(x_ptr + toks[:, None].to(tl.int64) * stride_x + ks[None, :],
                mask=t_ok[:, None] & k_ok[None, :], other=0.0)
    dt = x_ptr.dtype.element_ty
    if IN_SCALE:  # (x * router_scale) * in_mult, each rounded to x's dtype
        x_scale = tl.load(in_scale_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) * x_scale[None, :]).to(dt)
        x = (x.to(tl.float32) * in_mult).to(dt)
    if dt == tl.float32:
        part = tl.dot(x, tl.trans(w), input_precision="ieee")
    else:
        part = tl.dot(x, tl.trans(w))
    tile = rows[:, None] * BLOCK_E + experts[None, :]
    tl.store(part_ptr + s * (BLOCK_T * BLOCK_E) + tile, part)
    tl.debug_barrier()  # every thread's partials stored before the ticket is taken
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == n_slices - 1:  # the block's last program: all its partials are stored
        slices = tl.arange(0, BLOCK_S)
        parts = tl.load(part_ptr + slices[:, None, None] * (BLOCK_T * BLOCK_E) + tile[None, :, :],
                        mask=(slices < n_slices)[:, None, None], other=0.0,
                        cache_modifier=".cg")
        logits = tl.sum(parts, axis=0)
        if HAS_BIAS:
            logits += tl.load(b_ptr + experts, mask=e_ok, other=0.0).to(tl.float32)[None, :]
        logits = logits.to(dt).to(tl.float32)  # the linear layer's output
        vals, ids = pick_topk(logits, experts, n_experts, K, BLOCK_T, BLOCK_E, SOFTMAX_FIRST,
                              RENORMALIZE)
        if EXPERT_SCALE:
            vals = vals * tl.load(es_ptr + ids).to(tl.float32)
        store_topk(weights_ptr, ids_ptr, toks, t_ok, vals, ids, K)
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")


def _tiles(w: torch.Tensor) -> tuple[int, int, int]:
    """(slices, BLOCK_S, BLOCK_E) of a router weight [E, H]."""
    experts, hidden = w.shape
    slices = triton.cdiv(hidden, BLOCK_K)
    return slices, triton.next_power_of_2(slices), max(16, triton.next_power_of_2(experts))


def max_tokens(w: torch.Tensor) -> int:
    """The most tokens router weight ``w`` [E, H] takes through this kernel (0: none)."""
    _, block_s, block_e = _tiles(w)
    if block_s * BLOCK_T * block_e > MAX_TILE or block_e * BLOCK_K > MAX_TILE:
        return 0
    return min(256, MAX_PARTIALS // block_e) // BLOCK_T * BLOCK_T


def fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether tokens x [T, H] route through this kernel with router weight ``w`` [E, H]: at
    most ``max_tokens(w)`` of them, rows of unit stride, ``w`` contiguous in x's dtype."""
    return (x.dim() == 2 and x.stride(1) == 1 and w.is_contiguous() and x.dtype == w.dtype
            and x.shape[1] == w.shape[1] and 0 < x.shape[0] <= max_tokens(w))


def router_workspace(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A router's partial logits (float32, a tile a slice and token block) and its tickets
    (zero, one a token block)."""
    slices, _, block_e = _tiles(w)
    blocks = max_tokens(w) // BLOCK_T
    assert blocks, "this router takes no token through router_topk (max_tokens)"
    return (torch.empty(blocks * slices * BLOCK_T * block_e, dtype=torch.float32,
                        device=w.device),
            torch.zeros(blocks, dtype=torch.int32, device=w.device))


def router_topk(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, k: int,
                softmax_first: bool, renormalize: bool,
                workspace: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype = torch.float32,
                pdl: bool = False, in_scale: torch.Tensor | None = None, in_mult: float = 1.0,
                expert_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H] (``fits``), the router's weight [E, H] (contiguous) and bias [E] -> (weights
    [T, k] in ``dtype``, ids [T, k] int64), as ``topk_route(x @ w.T + b, ...)`` with the
    logits rounded to x's dtype; ``workspace`` from ``router_workspace(w)``. ``in_scale`` [H]
    (with ``in_mult``): x taken as ``x * in_scale * in_mult``; ``expert_scale`` [E]: each
    weight times its expert's (the module docstring)."""
    assert fits(x, w) and k & (k - 1) == 0
    n_tokens, hidden = x.shape
    slices, block_s, block_e = _tiles(w)
    part, ticket = workspace
    weights = torch.empty(n_tokens, k, dtype=dtype, device=x.device)
    ids = torch.empty(n_tokens, k, dtype=torch.int64, device=x.device)
    warps = max(4, min(16, block_s * BLOCK_T * block_e // 2048))
    _router_topk_kernel[(slices, triton.cdiv(n_tokens, BLOCK_T))](
        x, w, w if b is None else b, part, ticket, weights, ids,
        x if in_scale is None else in_scale, w if expert_scale is None else expert_scale,
        n_tokens, w.shape[0], hidden, x.stride(0), in_mult, K=k, BLOCK_T=BLOCK_T,
        BLOCK_E=block_e, BLOCK_K=BLOCK_K, BLOCK_S=block_s, HAS_BIAS=b is not None,
        IN_SCALE=in_scale is not None, EXPERT_SCALE=expert_scale is not None,
        SOFTMAX_FIRST=softmax_first, RENORMALIZE=renormalize, num_warps=warps,
        **pdl_.launch_options(x, pdl))
    return weights, ids
