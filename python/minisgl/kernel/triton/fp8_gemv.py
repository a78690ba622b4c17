"""FP8 matrix-vector product for batch-1 decode: ``y[1, N] = x[1, K] @ dequant(wq, ws)^T (+ b)``.

The bf16 GEMV (``gemv.py``) with the weight read as e4m3: half the bytes, so half the time of a
bandwidth-bound step. Scales are applied in registers without touching the weight tile: a program's
``BLOCK_N`` rows lie in one ``bn``-row block (``bn % BLOCK_N == 0``), so the scale of column ``k``
is the same for all of them, ``ws[row // bn, k // bk]``, and x is multiplied by it before the
multiply-add. x stays in bf16/fp16 (no activation quantization in decode).
Per-channel scales (``block=None``, ``ws [N, 1]``): the row's one scale multiplies its dot
product once, after the sum (``CHANNEL``), so the loop is the bf16 GEMV's with an e4m3 load.
``gated=True`` reads x as ``[gate | up]`` and applies ``silu(gate) * up`` as ``gemv.py`` does.

One-token decode of a ``--quantization fp8`` model runs no norm kernel: ``NORM`` scales the dot
products by ``rsqrt(mean(x^2) + eps)``, the sum of squares taken by every program as it reads x
(the norm's weight is folded into the weight's columns), and ``HAS_RES`` adds the residual as the
output is written, which saves the norm kernels' launches and their pass over x. As in
``gemv.py`` the first weight chunk is loaded before the PDL wait (no kernel writes a weight), so it
streams while the kernel before still runs.

``ACT`` (gate-up, per-channel): a program takes ``BLOCK_N // 2`` features, their gate rows and
their up rows ``N // 2`` further on, and writes ``silu(gate) * up`` (each rounded to x's dtype as
the separate ops would) to ``y [1, N/2]``. The down GEMV then reads a plain input of half the width
once per program instead of recomputing the SiLU in each of its programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .activation import silu_mul
from .gemv import load_w, load_x
from .pdl import wait_then_release

# e4m3 columns summed into one accumulator before the multiply-adds of the next chunk: one thread's
# 16-byte load, so the sum stays in its registers
RED = 16


@triton.jit
def _multiply_add(acc, squares, w, x_ptr, s_row, K, k0, ks, dt, GATED: tl.constexpr,
                  NORM: tl.constexpr, CHANNEL: tl.constexpr, SCALE_BK: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RED: tl.constexpr):
    """One chunk: ``acc += w * x`` (x's chunk scaled by block scales), and x's squares."""
    k_ok = k0 + ks < K
    x = load_x(x_ptr, K, k0 + ks, k_ok, dt, GATED)
    if NORM:  # every program reads all of x: each sums its squares itself
        squares += tl.sum(tl.reshape(x * x, (BLOCK_K // RED, RED)), axis=1)
    if not CHANNEL:
        x *= tl.load(s_row + (k0 + ks) // SCALE_BK, mask=k_ok, other=0.0)
    prod = w.to(tl.float32) * x[None, :]
    acc += tl.sum(tl.reshape(prod, (BLOCK_N, BLOCK_K // RED, RED)), axis=2)
    return acc, squares


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, r_ptr, y_ptr, N, K, stride_w, stride_s, eps,
                     SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr, GATED: tl.constexpr,
                     HAS_BIAS: tl.constexpr, EVEN: tl.constexpr, CHANNEL: tl.constexpr,
                     NORM: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, RED: tl.constexpr,
                     USE_PDL: tl.constexpr):
    first = tl.program_id(0) * BLOCK_N
    if ACT:  # BLOCK_N // 2 features: their gate rows, then their up rows (N // 2 further on)
        HALF: tl.constexpr = BLOCK_N // 2
        i = tl.arange(0, BLOCK_N)
        feats = tl.program_id(0) * HALF + i % HALF
        rows = feats + (i // HALF) * (N // 2)
        row_ok = feats < N // 2
    else:
        rows = first + tl.arange(0, BLOCK_N)
        row_ok = rows < N
    ks = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + ks[None, :]
    # no kernel writes a weight, so its first chunk is asked for before the wait (with PDL: while
    # the kernel before still runs)
    w = load_w(w_ptrs, row_ok, ks < K, EVEN)
    wait_then_release(USE_PDL)
    s_row = s_ptr + (first // SCALE_BN) * stride_s
    dt = y_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_K // RED), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K // RED,), dtype=tl.float32)
    acc, squares = _multiply_add(acc, squares, w, x_ptr, s_row, K, 0, ks, dt, GATED, NORM, CHANNEL,
                                 SCALE_BK, BLOCK_N, BLOCK_K, RED)
    for k0 in range(BLOCK_K, K, BLOCK_K):
        w_ptrs += BLOCK_K
        w = load_w(w_ptrs, row_ok, k0 + ks < K, EVEN)
        acc, squares = _multiply_add(acc, squares, w, x_ptr, s_row, K, k0, ks, dt, GATED, NORM,
                                     CHANNEL, SCALE_BK, BLOCK_N, BLOCK_K, RED)
    out = tl.sum(acc, axis=1)
    if CHANNEL:
        out *= tl.load(s_ptr + rows.to(tl.int64) * stride_s, mask=row_ok, other=0.0)
    if NORM:
        out *= tl.math.rsqrt(tl.sum(squares) / K + eps)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if HAS_RES:
        out += tl.load(r_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    if ACT:  # silu(gate) * up, each rounded as the gate-up output and the SiLU-and-mul would be
        gate, up = tl.split(tl.permute(tl.reshape(out.to(dt).to(tl.float32), (2, HALF)), (1, 0)))
        act = silu_mul(gate, up, dt)
        feats = tl.program_id(0) * HALF + tl.arange(0, HALF)
        tl.store(y_ptr + feats, act, mask=feats < N // 2)
    else:
        tl.store(y_ptr + rows, out.to(dt), mask=row_ok)


def pick_config(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps): four rows by 2048 columns (1024 when 2048 does not divide K),
    four warps. One accumulator per ``RED`` columns (not one per column) keeps a program at 56
    registers, so 2048-column chunks fit and keep twice the bytes in flight per SM. Short rows keep
    ``gemv.py``'s choice."""
    if k >= 2048 and k % 2048 == 0:
        return 4, 2048, 4
    if k >= 1024:
        return 4, 1024, 4
    return (4, 1024, 8) if n <= 2048 else (4, 512, 4)


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, block: tuple[int, int] | None,
             b: torch.Tensor | None = None, gated: bool = False,
             config: tuple[int, int, int] | None = None, norm_eps: float | None = None,
             residual: torch.Tensor | None = None, act: bool = False,
             pdl: bool = False) -> torch.Tensor:
    """x [1, K] (or [1, 2K] with ``gated``), e4m3 w [N, K], b [N] -> [1, N]; ws [N/bn, K/bk] block
    scales, or with ``block=None`` per-channel scales ws [N, 1].

    ``norm_eps``: x is first RMS-normalised (no weight: ``layers.fusion.fuse_norms`` put it into
    w), i.e. the dot products are scaled by ``rsqrt(mean(x^2) + eps)``, which each program sums as
    it reads x.
    ``residual [1, N]``: added to the output (the residual stream's add, as the output is
    written).
    ``act``: w is gate-up ``[gate; up]`` (per-channel scales) and the output is ``silu(gate) * up
    [1, N/2]``, the down projection's plain input (see the module's note)."""
    n, k = w.shape
    assert norm_eps is None or not gated, "the norm applies to a plain input"
    assert residual is None or residual.shape == (1, n) and residual.is_contiguous()
    channel = block is None
    assert not act or channel and n % 2 == 0 and residual is None, "act: per-channel gate-up"
    bn, bk = (1, k) if channel else block
    assert x.shape == (1, 2 * k if gated else k) and x.stride(1) == 1 and w.is_contiguous()
    assert ws.shape == (triton.cdiv(n, bn), triton.cdiv(k, bk)) and ws.stride(1) == 1
    block_n, block_k, warps = config or pick_config(n, k)
    if not channel:
        block_n = min(block_n, bn)
        assert bn % block_n == 0, (
            f"the block's rows ({bn}) must be a multiple of BLOCK_N ({block_n})")
    y = torch.empty((1, n // 2 if act else n), dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(triton.cdiv(n, block_n),)](
        x, w, ws, w if b is None else b, y if residual is None else residual, y, n, k,
        w.stride(0), ws.stride(0), 0.0 if norm_eps is None else norm_eps,
        SCALE_BN=bn, SCALE_BK=1 if channel else bk, GATED=gated, HAS_BIAS=b is not None,
        EVEN=k % block_k == 0 and n % block_n == 0, CHANNEL=channel, NORM=norm_eps is not None,
        HAS_RES=residual is not None, ACT=act, BLOCK_N=block_n, BLOCK_K=block_k, RED=RED,
        num_warps=warps, **pdl_.launch_options(x, pdl),
    )
    return y
