"""Dynamic per-token FP8 activation quantization for the per-channel linear method
(``minisgl.quant.fp8_dispatch``): ``x [M, K] -> (e4m3 [M, K], fp32 scale [M, 1])``, one scale per
token mapping the row's largest magnitude onto 448 (``quantize_groups(x, K)`` in torch).

One program per token. A row of up to ``ONE_PASS_MAX`` columns is loaded whole, in one step (all of
it in flight at once), its absolute maximum taken and the row divided and stored from registers;
two passes of 1,024-column steps would leave each program waiting on one step's loads at a time.
Longer rows take the two passes (the second read hits L2). ``gated=True`` reads ``[gate | up]``
and quantizes ``silu(gate) * up`` (rounded as ``silu_and_mul`` rounds), so the MLP's activation
costs no extra pass over memory.
Under PDL the kernel waits for its predecessor, then lets its successor (the W8A8 GEMM) launch at
once: the GEMM's programs are resident, asking L2 for their first weight tiles, while this one runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .activation import silu_mul
from .pdl import wait_then_release

FP8_MAX = tl.constexpr(448.0)
ONE_PASS_MAX = 16384  # the longest row held whole: 32 values (64 gated) per thread of 16 warps


@triton.jit
def load_act(row_ptr, cols, ok, K, GATED: tl.constexpr):
    x = tl.load(row_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if GATED:
        dt = row_ptr.dtype.element_ty
        up = tl.load(row_ptr + K + cols, mask=ok, other=0.0).to(tl.float32)
        x = silu_mul(x, up, dt).to(tl.float32)
    return x


@triton.jit
def fp8_scale(amax):
    """The scale mapping a largest magnitude onto 448 (an all-zero row keeps a finite one)."""
    return tl.maximum(amax, 1e-12) / FP8_MAX


@triton.jit
def saturate(x, scale):
    """``x / scale`` clamped to e4m3's range, ready for the cast."""
    return tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)


@triton.jit
def _quantize_tokens_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q,
                            GATED: tl.constexpr, ONE_PASS: tl.constexpr, BLOCK: tl.constexpr,
                            USE_PDL: tl.constexpr):
    wait_then_release(USE_PDL)
    m = tl.program_id(0).to(tl.int64)
    row = x_ptr + m * stride_x
    offs = tl.arange(0, BLOCK)
    if ONE_PASS:  # the whole row (``pick_block``): one load
        ok = offs < K
        x = load_act(row, offs, ok, K, GATED)
        scale = fp8_scale(tl.max(tl.abs(x), 0))
        tl.store(q_ptr + m * stride_q + offs, saturate(x, scale).to(q_ptr.dtype.element_ty),
                 mask=ok)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            cols = k0 + offs
            x = load_act(row, cols, cols < K, K, GATED)
            amax = tl.maximum(amax, tl.abs(x))
        scale = fp8_scale(tl.max(amax, 0))
        for k0 in range(0, K, BLOCK):
            cols = k0 + offs
            ok = cols < K
            x = load_act(row, cols, ok, K, GATED)
            tl.store(q_ptr + m * stride_q + cols, saturate(x, scale).to(q_ptr.dtype.element_ty),
                     mask=ok)
    tl.store(s_ptr + m, scale)


def pick_block(k: int) -> tuple[int, int]:
    """(BLOCK, num_warps): the whole row up to ``ONE_PASS_MAX`` columns (at most 32 per thread),
    else 1024-column steps with 4 warps."""
    if k > ONE_PASS_MAX:
        return 1024, 4
    block = triton.next_power_of_2(max(k, 16))
    return block, max(1, min(16, block // 512))


def quantize_tokens(x: torch.Tensor, gated: bool = False,
                    pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (``[M, 2K]`` = [gate | up] with ``gated``) -> (e4m3 ``[M, K]``,
    fp32 ``[M, 1]``)."""
    m, width = x.shape
    k = width // 2 if gated else width
    assert x.stride(1) == 1
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m:
        block, warps = pick_block(k)
        _quantize_tokens_kernel[(m,)](x, q, s, k, x.stride(0), q.stride(0), GATED=gated,
                                      ONE_PASS=block >= k, BLOCK=block, num_warps=warps,
                                      **pdl_.launch_options(x, pdl))
    return q, s
