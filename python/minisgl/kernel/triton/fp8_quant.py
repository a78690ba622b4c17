"""Dynamic per-token FP8 activation quantization for the per-channel linear method
(``minisgl.quant.linear``): ``x [M, K] -> (e4m3 [M, K], fp32 scale [M, 1])``, one scale per token
mapping the row's largest magnitude onto 448 (``quantize_groups(x, K)`` in torch).

One program per token walks the row twice in ``BLOCK`` chunks: the first pass takes the absolute
maximum, the second divides and stores (a row is at most a few tens of KB, so the second read hits
L2). ``gated=True`` reads ``[gate | up]`` and quantizes ``silu(gate) * up`` (rounded as
``silu_and_mul`` rounds), recomputed in the second pass, so the MLP's activation costs no extra pass
over memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)


@triton.jit
def _load_act(row_ptr, cols, ok, K, GATED: tl.constexpr):
    x = tl.load(row_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if GATED:
        dt = row_ptr.dtype.element_ty
        up = tl.load(row_ptr + K + cols, mask=ok, other=0.0).to(tl.float32)
        x = ((x / (1.0 + tl.exp(-x))).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)
    return x


@triton.jit
def _quantize_tokens_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
                            GATED: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    row = x_ptr + m * stride_x
    offs = tl.arange(0, BLOCK)
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        cols = k0 + offs
        x = _load_act(row, cols, cols < K, K, GATED)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, 0), 1e-12) / FP8_MAX
    for k0 in range(0, K, BLOCK):
        cols = k0 + offs
        ok = cols < K
        x = _load_act(row, cols, ok, K, GATED)
        q = tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)
        tl.store(q_ptr + m * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + m, scale)


def pick_block(k: int) -> tuple[int, int]:
    """(BLOCK, num_warps): up to 1024 columns a step, 8 per thread."""
    block = min(1024, triton.next_power_of_2(max(k, 16)))
    return block, max(1, min(4, block // 256))


def quantize_tokens(x: torch.Tensor, gated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (``[M, 2K]`` = [gate | up] with ``gated``) -> (e4m3 ``[M, K]``, fp32 ``[M, 1]``)."""
    m, width = x.shape
    k = width // 2 if gated else width
    assert x.stride(1) == 1
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block, warps = pick_block(k)
        _quantize_tokens_kernel[(m,)](x, q, s, k, x.stride(0), q.stride(0), GATED=gated,
                                      BLOCK=block, num_warps=warps)
    return q, s
