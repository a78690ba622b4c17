"""Matrix-vector product for batch-1 decode: ``y[1, N] = x[1, K] @ w[N, K]^T (+ b)``.

With one token a linear layer reads its whole weight to produce one row, so it is bound by HBM
bandwidth and the only thing that matters is streaming ``w`` at full speed; cuBLAS's kernels for this
shape reach 2.0-2.8 TB/s on an H100, this one 2.5-3.2 (``benchmark/kernels/bench_gemv.py``). Each
program owns ``BLOCK_N`` rows of ``w`` (four: enough programs for any layer), walks K in
``BLOCK_K`` chunks (coalesced: rows are contiguous in K) and multiply-adds into an fp32 accumulator
per (row, k lane), summed once at the end: no tensor cores, no split-K, no second pass. At 2-8
tokens cuBLAS is as fast or faster, so the layers use this only for one token.

``gated=True`` reads x as ``[gate | up]`` (length 2K) and multiplies by ``silu(gate) * up``, rounded
as ``silu_and_mul`` rounds: the MLP's activation costs no kernel of its own. ``norm=PreNorm(...)``
applies the decoder layer's residual add and RMSNorm as x is read (``load_normed_x``): every
program reads all of x anyway, so it sums x's squares on the way and scales its dot products by
the reciprocal RMS at the end; program 0 writes ``x + residual`` for the next layer. The norm
before the QKV and gate-up projections costs no kernel of its own either.

Block sizes come from ``pick_config``, a rule fitted to ``bench_gemv.py --sweep`` (no autotuning: the
layers run inside CUDA-graph capture, where timing candidates is not allowed).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import pdl
from .pdl import wait_then_release


@triton.jit
def load_x(x_ptr, K, offs, ok, dt, GATED: tl.constexpr):
    """x[offs] in fp32; with ``GATED``, x is [gate | up] and this is silu(gate) * up, rounded to
    the activation dtype ``dt`` after each op as the unfused SiLU-and-mul would."""
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    if GATED:
        up = tl.load(x_ptr + K + offs, mask=ok, other=0.0).to(tl.float32)
        x = ((x / (1.0 + tl.exp(-x))).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)
    return x


@triton.jit
def load_normed_x(x_ptr, r_ptr, g_ptr, r_out_ptr, offs, ok, dt, HAS_RES: tl.constexpr):
    """(x[offs] * g[offs], x[offs]^2) in fp32, x = x + residual rounded to ``dt`` as the unfused
    add rounds it; program 0 stores that sum to ``r_out`` (the other programs only read)."""
    x = tl.load(x_ptr + offs, mask=ok, other=0.0)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(r_ptr + offs, mask=ok, other=0.0).to(tl.float32)).to(dt)
        if tl.program_id(0) == 0:
            tl.store(r_out_ptr + offs, x, mask=ok)
    x = x.to(tl.float32)
    return x * tl.load(g_ptr + offs, mask=ok, other=0.0).to(tl.float32), x * x


class PreNorm(NamedTuple):
    """The RMSNorm a GEMV applies to x as it reads it: ``x + residual`` (residual None: x alone),
    rounded to x's dtype and written to ``residual_out``, times ``rsqrt(mean(square) + eps)`` and
    ``weight``. The reciprocal RMS multiplies each dot product once, at the end."""

    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None = None
    residual_out: torch.Tensor | None = None

    def kernel_args(self, x: torch.Tensor) -> tuple:
        """(r_ptr, g_ptr, r_out_ptr, eps) for a kernel's ``NORM`` arguments."""
        k = x.shape[1]
        assert self.weight.shape == (k,) and (self.residual is None) == (self.residual_out is None)
        if self.residual is not None:
            assert self.residual.shape == x.shape == self.residual_out.shape
            assert self.residual.stride(1) == 1 and self.residual_out.stride(1) == 1
            return self.residual, self.weight, self.residual_out, self.eps
        return x, self.weight, x, self.eps


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, r_ptr, g_ptr, r_out_ptr, N, K, stride_w, eps,
                 GATED: tl.constexpr, NORM: tl.constexpr, HAS_RES: tl.constexpr,
                 HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    wait_then_release(USE_PDL)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < N
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + ks[None, :]
    dt = y_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + ks < K
        if EVEN:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
        else:
            w = tl.load(w_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0,
                        eviction_policy="evict_first")
        if NORM:
            x, sq = load_normed_x(x_ptr, r_ptr, g_ptr, r_out_ptr, k0 + ks, k_ok, dt, HAS_RES)
            squares += sq
        else:
            x = load_x(x_ptr, K, k0 + ks, k_ok, dt, GATED)
        acc += w.to(tl.float32) * x[None, :]
        w_ptrs += BLOCK_K
    out = tl.sum(acc, axis=1)
    if NORM:
        out *= tl.math.rsqrt(tl.sum(squares, axis=0) / K + eps)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, out.to(dt), mask=row_ok)


def pick_config(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) for a [n, k] weight, from the H100 sweep: long rows want 2048-wide
    chunks; short ones 512, or 1024 with 8 warps when there are few rows (few programs)."""
    if k >= 4096:
        block_k = 2048
        while k % block_k and block_k > 512:
            block_k //= 2  # a chunk that divides k: no masks
        return 4, block_k, 4
    return (4, 1024, 8) if n <= 2048 else (4, 512, 4)


def gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, gated: bool = False,
         config: tuple[int, int, int] | None = None, norm: PreNorm | None = None) -> torch.Tensor:
    """x [1, K] (or [1, 2K] with ``gated``), w [N, K] contiguous, b [N] -> [1, N] in x's dtype;
    ``norm``: x is normalised as it is read (not with ``gated``)."""
    n, k = w.shape
    assert x.shape == (1, 2 * k if gated else k) and x.stride(1) == 1 and w.is_contiguous()
    assert not (gated and norm is not None), "a gated input is not normalised"
    block_n, block_k, warps = config or pick_config(n, k)
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    r, g, r_out, eps = norm.kernel_args(x) if norm is not None else (x, x, x, 0.0)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, w if b is None else b, y, r, g, r_out, n, k, w.stride(0), eps, GATED=gated,
        NORM=norm is not None, HAS_RES=norm is not None and norm.residual is not None,
        HAS_BIAS=b is not None,
        EVEN=k % block_k == 0 and n % block_n == 0, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, **pdl.launch_options(x),
    )
    return y
