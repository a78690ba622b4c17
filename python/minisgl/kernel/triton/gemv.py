"""Skinny matmul for small-batch decode: ``y[M, N] = x[M, K] @ w[N, K]^T (+ b)`` for M <= 8.

At batch 1-8 a linear layer reads its whole weight to produce a few rows, so it is bound by HBM
bandwidth and the only thing that matters is streaming ``w`` at full speed. Each program owns
``BLOCK_N`` output columns, walks K in ``BLOCK_K`` chunks (rows of ``w`` are contiguous in K, so
every load is coalesced) and multiplies-and-adds into an fp32 accumulator per (row of x, column,
k lane), summed once at the end; there is no split-K, so no second pass and no atomics: a small
``BLOCK_N`` gives enough programs to fill the GPU instead. No tensor cores: at M <= 8 the FMA units
keep up with HBM, and fp32 inputs stay exact (a ``tl.dot`` would round them to TF32).

Block sizes come from ``pick_config``, a rule fitted to ``benchmark/kernels/bench_gemv.py --sweep``
(no autotuning: the layers run inside CUDA-graph capture, where timing candidates is not allowed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_M = 8  # beyond this cuBLAS's tiled GEMMs win


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, K, stride_x, stride_w, stride_y,
                 M: tl.constexpr, M_PAD: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, M_PAD)
    ks = tl.arange(0, BLOCK_K)
    col_ok = cols < N
    w_ptrs = w_ptr + cols[:, None].to(tl.int64) * stride_w + ks[None, :]
    x_ptrs = x_ptr + rows[:, None] * stride_x + ks[None, :]
    # products summed over K only at the end: the loop is loads and multiply-adds, nothing else
    acc = tl.zeros((M_PAD, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN:
            w = tl.load(w_ptrs, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=rows[:, None] < M, other=0.0)
        else:
            k_ok = k0 + ks < K
            w = tl.load(w_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0,
                        eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=(rows[:, None] < M) & k_ok[None, :], other=0.0)
        acc += w.to(tl.float32)[None, :, :] * x.to(tl.float32)[:, None, :]
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    out = tl.sum(acc, axis=2)  # [M_PAD, BLOCK_N]
    if HAS_BIAS:
        out += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rows[:, None] * stride_y + cols[None, :]
    tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=(rows[:, None] < M) & col_ok[None, :])


def pick_config(m: int, n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps): four columns per program (enough programs for any layer),
    and the accumulator kept at 8K fp32 values (64 registers a thread at 4 warps). Measured on
    H100 by ``benchmark/kernels/bench_gemv.py --sweep`` (results in benchmark/kernels/results)."""
    m_pad = triton.next_power_of_2(m)
    block_k = min(1024 // m_pad, triton.next_power_of_2(k))
    return 4, block_k, 8 if n <= 4096 or n > 65536 else 4


def gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
         config: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_M, last dim contiguous), w [N, K] contiguous, b [N] -> [M, N] in x's dtype."""
    m, k = x.shape
    n = w.shape[0]
    assert 1 <= m <= MAX_M and w.shape[1] == k and x.stride(1) == 1 and w.is_contiguous()
    block_n, block_k, warps = config or pick_config(m, n, k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    even = k % block_k == 0 and n % block_n == 0
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, w if b is None else b, y, n, k, x.stride(0), w.stride(0), y.stride(0),
        M=m, M_PAD=triton.next_power_of_2(m), HAS_BIAS=b is not None, EVEN=even, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps,
    )
    return y
