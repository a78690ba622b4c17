"""Matrix-vector product for batch-1 decode: ``y[1, N] = x[1, K] @ w[N, K]^T (+ b)``.

With one token a linear layer reads its whole weight to produce one row, so it is bound by HBM
bandwidth and the only thing that matters is streaming ``w`` at full speed, which this kernel does
faster than cuBLAS's for that shape (``benchmark/kernels/bench_gemv.py``; figures in
docs/performance.md, "Measurements behind the code"). Each program owns ``BLOCK_N`` rows of ``w``
(four: enough programs for any layer), walks K in ``BLOCK_K`` chunks (coalesced: rows are
contiguous in K) and multiply-adds into an fp32 accumulator per (row, k lane), summed once at the
end: no tensor cores, no split-K, no second pass. From 2 tokens on cuBLAS is as fast or faster, so
the layers use this only for one token. The first chunk of weight rows is loaded before the PDL
wait (``pdl.py``): the previous kernel is still finishing while it arrives.

``gated=True`` reads x as ``[gate | up]`` (length 2K) and multiplies by ``silu(gate) * up``, rounded
as ``silu_and_mul`` rounds: the MLP's activation costs no kernel of its own.

Block sizes come from ``pick_config``, a rule fitted to ``bench_gemv.py --sweep`` (no autotuning:
the layers run inside CUDA-graph capture, where timing candidates is not allowed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .activation import silu_mul
from .pdl import wait_then_release


@triton.jit
def load_x(x_ptr, K, offs, ok, dt, GATED: tl.constexpr):
    """x[offs] in fp32; with ``GATED``, x is [gate | up] and this is silu(gate) * up, rounded to
    the activation dtype ``dt`` after each op as the unfused SiLU-and-mul would."""
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if GATED:
        up = tl.load(x_ptr + K + offs, mask=ok, other=0.0).to(tl.float32)
        x = silu_mul(x, up, dt).to(tl.float32)
    return x


@triton.jit
def load_w(w_ptrs, row_ok, k_ok, EVEN: tl.constexpr):
    """A chunk of weight rows, streamed (evicted first: it is read once per step)."""
    if EVEN:
        w = tl.load(w_ptrs, eviction_policy="evict_first")
    else:
        w = tl.load(w_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0,
                    eviction_policy="evict_first")
    return w


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_w,
                 GATED: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < N
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + ks[None, :]
    # no kernel writes a weight, so its first chunk is asked for before the wait (with PDL: while
    # the kernel before still runs)
    w = load_w(w_ptrs, row_ok, ks < K, EVEN)
    wait_then_release(USE_PDL)
    dt = y_ptr.dtype.element_ty
    acc = w.to(tl.float32) * load_x(x_ptr, K, ks, ks < K, dt, GATED)[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        w_ptrs += BLOCK_K
        k_ok = k0 + ks < K
        w = load_w(w_ptrs, row_ok, k_ok, EVEN)
        acc += w.to(tl.float32) * load_x(x_ptr, K, k0 + ks, k_ok, dt, GATED)[None, :]
    out = tl.sum(acc, axis=1)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, out.to(dt), mask=row_ok)


def pick_config(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) for a [n, k] weight, from the H100 sweep: long rows want
    2048-wide chunks; short ones 512, or 1024 with 8 warps when there are few rows (few
    programs)."""
    if k >= 4096:
        block_k = 2048
        while k % block_k and block_k > 512:
            block_k //= 2  # a chunk that divides k: no masks
        return 4, block_k, 4
    return (4, 1024, 8) if n <= 2048 else (4, 512, 4)


def gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, gated: bool = False,
         config: tuple[int, int, int] | None = None, pdl: bool = False) -> torch.Tensor:
    """x [1, K] (or [1, 2K] with ``gated``), w [N, K] contiguous, b [N] -> [1, N] in x's dtype."""
    n, k = w.shape
    assert x.shape == (1, 2 * k if gated else k) and x.stride(1) == 1 and w.is_contiguous()
    block_n, block_k, warps = config or pick_config(n, k)
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, w if b is None else b, y, n, k, w.stride(0), GATED=gated, HAS_BIAS=b is not None,
        EVEN=k % block_k == 0 and n % block_n == 0, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, **pdl_.launch_options(x, pdl),
    )
    return y
