"""A few tokens (2-16: a verify step's rows, a small decode batch) through a linear layer with
16-bit weights: ``y[M, N] = x[M, K] @ w[N, K]^T (+ b)``.

Like one token (``gemv.py``), a few tokens only stream the weight: the layer is bound by reading
it, and cuBLAS's kernels for these shapes cost more than that read where the layers are small.
They also break the chain of programmatic dependent launches (``pdl.py``) that a decode step's
Triton kernels form: SmolLM2-135M's decode graph takes 0.50 ms on an H100 at one row, where the
GEMVs overlap their neighbours, and 0.91 ms at two rows, its kernels' summed time (cuBLAS for
the linear layers), though the kernels alone take about as long in both. This is the swap-AB
program of ``fp8_w8a16`` on 16-bit weights (the weight tile is the MMA's large side, the tokens
padded to 16 the small one), launched with PDL, with split-K where a layer has too few row tiles
to fill the GPU. Tiles come from ``pick_config``, fitted to ``benchmark/kernels/bench_gemv.py
--tokens 2,5,9 --sweep``.
"""

from __future__ import annotations

import torch
import triton

from .fp8_w8a16 import W8A16Config, _launch, _sms

MAX_TOKENS = 16  # one M tile; beyond it cuBLAS's tiles win


def pick_config(m: int, n: int, k: int, sms: int) -> W8A16Config:
    """The widest row tile (64, 32 or 16 rows) that still gives every SM a program, then split-K
    up to 4 while there are at most two programs per SM and each split keeps two K steps."""
    block_k = 128
    block_n = 64
    while block_n > 16 and triton.cdiv(n, block_n) < sms:
        block_n //= 2
    tiles = triton.cdiv(n, block_n)
    split = 4
    while split > 1 and (tiles * split > 2 * sms or k // (block_k * split) < 2):
        split //= 2
    return W8A16Config(16, block_n, block_k, split, 4, 3)


def few_token_gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                   gated: bool = False, config: W8A16Config | None = None,
                   pdl: bool = False) -> torch.Tensor:
    """x [M, K] (``[M, 2K]`` = [gate | up] with ``gated``: the input is ``silu(gate) * up``),
    w [N, K] contiguous in x's dtype, bias [N] -> [M, N] in x's dtype; M <= ``MAX_TOKENS``."""
    n, k = w.shape
    m = x.shape[0]
    assert x.dim() == 2 and x.shape[1] == (2 * k if gated else k) and x.stride(1) == 1
    assert m <= MAX_TOKENS
    cfg = config or pick_config(m, n, k, _sms(x))
    return _launch(x, None, w, None, None, bias, gated, cfg, x.dtype, pdl)
