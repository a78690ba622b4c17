"""Matrix-vector products for batch-1 decode and verify: ``y[M, N] = x[M, K] @ w[N, K]^T (+ b)``
for 1 <= M <= 8 tokens.

With one token a linear layer reads its whole weight to produce one row, so it is bound by HBM
bandwidth and the only thing that matters is streaming ``w`` at full speed; cuBLAS's kernels for
this shape reach 2.0-2.8 TB/s on an H100, this one 2.5-3.2 (``benchmark/kernels/bench_gemv.py``).
Each program owns ``BLOCK_N`` rows of ``w`` (four: enough programs for any layer) and walks K in
``BLOCK_K`` chunks (coalesced: rows are contiguous in K): no tensor cores, no split-K, no second
pass. A few tokens (a speculative verify step at batch 1, ``spec/rows.py``) share each chunk as it
is read, so they cost the weight's bytes once, where cuBLAS's small-M kernels read it at a lower
rate. Every token's chunk product is reduced on its own, by the same operations whatever the
number of tokens: a token's output is bit for bit what it is alone, so a verify step computes
each position as the plain decode step would, and greedy output with speculation is the output
without it. The first chunk of weight rows is loaded before the PDL wait (``pdl.py``): the
previous kernel is still finishing while it arrives (Qwen3-8B batch 1, H100: 5.50 against
5.62-5.64 ms).

``gated=True`` reads x as ``[gate | up]`` (length 2K) and multiplies by ``silu(gate) * up``, rounded
as ``silu_and_mul`` rounds: the MLP's activation costs no kernel of its own.

Block sizes come from ``pick_config``, a rule fitted to ``bench_gemv.py --sweep`` (no autotuning:
the layers run inside CUDA-graph capture, where timing candidates is not allowed); they do not
depend on the number of tokens (that would change a token's reduction).
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
def _accumulate(acc, w, x_ptr, stride_x, M, K, offs, k_ok, dt, GATED: tl.constexpr,
                ROWS: tl.constexpr):
    """acc[m] += the chunk ``w`` times token m's x chunk, reduced over the chunk: the same
    operations for every token whatever ROWS is, so a token's output does not depend on how many
    tokens share the call."""
    tokens = tl.arange(0, ROWS)
    for m in tl.static_range(ROWS):
        live = tl.full([1], m, tl.int32) < M  # padding tokens (ROWS > M) load zeros
        x = load_x(x_ptr + m * stride_x, K, offs, k_ok & live, dt, GATED)
        part = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        acc = tl.where(tokens[:, None] == m, acc + part[None, :], acc)
    return acc


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_w, stride_x,
                 GATED: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 USE_PDL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < N
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + ks[None, :]
    # no kernel writes a weight, so its first chunk is asked for before the wait (with PDL: while
    # the kernel before still runs)
    w = load_w(w_ptrs, row_ok, ks < K, EVEN)
    wait_then_release(USE_PDL)
    dt = y_ptr.dtype.element_ty
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    acc = _accumulate(acc, w, x_ptr, stride_x, M, K, ks, ks < K, dt, GATED, ROWS)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        w_ptrs += BLOCK_K
        k_ok = k0 + ks < K
        w = load_w(w_ptrs, row_ok, k_ok, EVEN)
        acc = _accumulate(acc, w, x_ptr, stride_x, M, K, k0 + ks, k_ok, dt, GATED, ROWS)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[None, :]
    tokens = tl.arange(0, ROWS)
    y_ptrs = y_ptr + tokens[:, None] * N + rows[None, :]
    tl.store(y_ptrs, acc.to(dt), mask=(tokens[:, None] < M) & row_ok[None, :])


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


MAX_ROWS = 8  # the most tokens one call takes (a verify step of batch 1: spec/rows.py)


def gemv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, gated: bool = False,
         config: tuple[int, int, int] | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M, K] (or [M, 2K] with ``gated``), 1 <= M <= ``MAX_ROWS``, w [N, K] contiguous, b [N]
    -> [M, N] in x's dtype. Each token's row is computed exactly as it is alone."""
    n, k = w.shape
    m = x.shape[0]
    assert 1 <= m <= MAX_ROWS and x.shape[1] == (2 * k if gated else k)
    assert x.stride(1) == 1 and w.is_contiguous()
    block_n, block_k, warps = config or pick_config(n, k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, w if b is None else b, y, m, n, k, w.stride(0), x.stride(0), GATED=gated,
        HAS_BIAS=b is not None, EVEN=k % block_k == 0 and n % block_n == 0,
        ROWS=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        **pdl_.launch_options(x, pdl),
    )
    return y
