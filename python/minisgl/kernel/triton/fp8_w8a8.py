"""W8A8 FP8 GEMM with TMA loads (Hopper): ``y[M, N] = (xq * xs) @ (wq * ws)^T (+ b)``.

The per-channel FP8 layers' batched-decode GEMM (2-256 tokens) on an sm_90 GPU: e4m3 x quantized
per token (``fp8_quant.quantize_tokens``), e4m3 weight rows with one scale each, ``tl.dot`` of two
e4m3 tiles on the FP8 tensor cores. The tiles are "swap AB" like ``fp8_w8a16.py``'s: a program
computes ``acc[BLOCK_N, BLOCK_M] = w[BLOCK_N, K] @ x[BLOCK_M, K]^T``, the weight rows on the
MMA's large side and the tokens, as few as 16, on its small one.

The difference is how the tiles reach shared memory. ``fp8_w8a16``'s W8A8 form loads them with
per-thread asynchronous copies: every warp computes addresses and masks and the CTA meets at a
barrier each K step, and with one 4-warp CTA per SM (the 64-row tiles of a 4,096-row layer make
one wave) Nsight Compute showed it issue-bound at ~58% of DRAM bandwidth (down projection, 128
tokens). Here a tensor descriptor per operand (``TensorDescriptor``) lets one thread ask the TMA
unit for a whole tile; rows past M or N and columns past K arrive as zeros, so there are no masks.

Scales multiply the accumulator once (row scale x token scale), then the bias; the output is
rounded once. ``PROMOTE`` adds each K step's MMA sum to the accumulator in fp32 (Hopper's FP8 MMA
accumulates with fewer mantissa bits; see ``fp8_w8a16.FAST_ACCUM_MAX_K``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .fp8_w8a16 import FAST_ACCUM_MAX_K


@triton.jit
def _w8a8_tma_kernel(x_desc, w_desc, xs_ptr, ws_ptr, b_ptr, y_ptr, M, N, K,
                     HAS_BIAS: tl.constexpr, PROMOTE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     STAGES: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_m = tl.program_id(0) % tiles_m  # the M tiles of one N tile run together: its weight hits L2
    pid_n = tl.program_id(0) // tiles_m
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES, warp_specialize=WARP_SPECIALIZE):
        w = w_desc.load([off_n, k0])
        x = x_desc.load([off_m, k0])
        if PROMOTE:
            acc = tl.dot(w, tl.trans(x), acc, max_num_imprecise_acc=BLOCK_K)
        else:
            acc = tl.dot(w, tl.trans(x), acc)
    rows = off_n + tl.arange(0, BLOCK_N)
    toks = off_m + tl.arange(0, BLOCK_M)
    n_ok, m_ok = rows < N, toks < M
    acc *= tl.load(ws_ptr + rows, mask=n_ok, other=0.0)[:, None]
    acc *= tl.load(xs_ptr + toks, mask=m_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=n_ok, other=0.0).to(tl.float32)[:, None]
    y_ptrs = y_ptr + toks[None, :].to(tl.int64) * N + rows[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


@dataclass(frozen=True)
class TmaConfig:
    block_m: int
    block_n: int = 64
    block_k: int = 256
    num_warps: int = 4
    stages: int = 4
    warp_specialize: bool = False


def pick_config(m: int, n: int, k: int, sms: int = 132) -> TmaConfig:
    """A first rule (to be fitted by ``bench_fp8_small.py --sweep tma``): 64-row weight tiles,
    the tokens in one tile up to 128 (two beyond), 256-deep K steps through four stages."""
    block_m = min(128, max(16, triton.next_power_of_2(m)))
    return TmaConfig(block_m)


def tma_ok(xq: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the TMA form can take these operands: a CUDA device of compute capability 9.0+,
    K a multiple of 16 (the descriptors' 16-byte row strides) and contiguous rows."""
    return (xq.is_cuda and torch.cuda.get_device_capability(xq.device)[0] >= 9
            and w.shape[1] % 16 == 0 and xq.is_contiguous() and w.is_contiguous())


def fp8_w8a8_tma_gemm(xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor,
                      bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                      config: TmaConfig | None = None) -> torch.Tensor:
    """e4m3 xq [M, K] with per-token scales xs [M, 1], e4m3 w [N, K] with per-channel scales
    ws [N, 1], bias [N] -> [M, N] in ``out_dtype``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, k = xq.shape
    n = w.shape[0]
    assert w.shape[1] == k and xq.dtype == w.dtype == torch.float8_e4m3fn
    assert xs.shape == (m, 1) and xs.dtype == torch.float32 and xs.is_contiguous()
    assert ws.shape == (n, 1) and ws.dtype == torch.float32 and ws.is_contiguous()
    assert bias is None or bias.shape == (n,) and bias.is_contiguous()
    cfg = config or pick_config(m, n, k)
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return y
    x_desc = TensorDescriptor.from_tensor(xq, [cfg.block_m, cfg.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k])
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _w8a8_tma_kernel[grid](
        x_desc, w_desc, xs, ws, w if bias is None else bias, y, m, n, k,
        HAS_BIAS=bias is not None, PROMOTE=k > FAST_ACCUM_MAX_K,
        WARP_SPECIALIZE=cfg.warp_specialize, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, STAGES=cfg.stages, num_warps=cfg.num_warps,
    )
    return y
