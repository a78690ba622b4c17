"""W8A16 FP8 GEMM for batched decode: ``y[M, N] = x[M, K] @ dequant(wq, ws)^T (+ b)``, M ~ 2..32,
and its W8A8 form for larger batches.

At a few tens of tokens a linear layer is still bound by reading its weight, yet the per-token
FP8 path (quantize x, then ``torch._scaled_mm``) spends a kernel on the activations and streams
the weight slowly. Here the e4m3 weight tile is converted to x's dtype in registers and
multiplied on the bf16/fp16 tensor cores: one kernel, no activation rounding, half the bytes of
bf16; up to 32 tokens it is faster than quantize + ``_scaled_mm`` with a tenth of its error, from
64 on slower (the e4m3 -> bf16 register operand costs each warp latency, and every N tile re-reads
x from L2). Figures: docs/performance.md, "Measurements behind the code".

"Swap AB": each program computes a tile of ``y^T``, ``acc[BLOCK_N, BLOCK_M] += w[BLOCK_N, BLOCK_K] @
x[BLOCK_M, BLOCK_K]^T``, so the MMA's large dimension is N (64-128 weight rows) and M, the tokens,
may be as small as 16. Padding tokens are masked (zero-filled, no memory access); weight rows past
N are clamped (read row 0, never stored), so an even K loads the weight with no predicates.

Scales: per-output-channel ``ws [N, 1]`` (``block=None``) multiply the accumulator's rows once at
the end; 128x128 block scales ``ws [N/bn, K/bk]`` are one scalar per program and K step, since
``BLOCK_N`` divides ``bn`` and ``BLOCK_K`` divides ``bk``: ``acc += dot(w, x^T) * s``.

Split-K: an N tile is one program, and a layer with few rows (o, down: N = 4096) would leave most
of an H100's 132 SMs idle with the 64-128-row tiles that keep x's re-reads from L2 low (each N tile
reads all of x; smaller tiles read it more often). ``split_k > 1`` spreads a tile's K steps over
several programs, each writing an fp32 partial ``[M, N]``; a second small kernel sums them in a
fixed order (deterministic, unlike atomics), adds the bias and rounds once.

W8A8 (``fp8_w8a8_gemm``): the same program on e4m3 x quantized per token
(``fp8_quant.quantize_tokens``), ``tl.dot`` of two e4m3 tiles on the FP8 tensor cores, the row's
and the token's scales applied to the accumulator once. Per-channel bf16 layers run it for 2-256
tokens: faster than the W8A16 form (no register conversion of the weight tile) and than
``torch._scaled_mm``, whose cuBLASLt tiles leave the layers with 4,096 rows (o, down) ~32 tiles
for 132 SMs; here the tokens are cut into as many tiles as one wave holds
(``fp8_w8a16_config``). The price is x's rounding to e4m3 (what vLLM's and SGLang's FP8 layers
do): ~2.5e-2 relative error against ~2.7e-3 for the W8A16 form. With block scales (FP8
checkpoints) x comes quantized per token and 128 columns (``fp8_gemm.quantize_act``) and each K
step adds its dot times the block's scale and its tokens' group scales (loaded a step ahead) to
the fp32 accumulator.

``gated=True`` reads x as ``[gate | up]`` and multiplies by ``silu(gate) * up``, rounded as
``gemv.load_x`` rounds (as the unfused SiLU-and-mul would). Configs come from
``fp8_w8a16_config.pick_config`` (no autotuning: the layers run inside CUDA-graph capture);
``benchmark/kernels/bench_fp8_small.py --sweep`` times a grid of them.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from . import pdl as pdl_
from .fp8_w8a16_config import SMS, W8A16Config, pick_config, sm_count
from .gemv import load_x
from .pdl import release, wait


@triton.jit
def _w8a16_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, steps_per_split,
                  stride_x, stride_w, stride_s, stride_xs,
                  CHANNEL: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
                  GATED: tl.constexpr, A8: tl.constexpr, HAS_BIAS: tl.constexpr,
                  EVEN_M: tl.constexpr, EVEN_K: tl.constexpr, SPLIT: tl.constexpr,
                  DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, USE_PDL: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid_m = tl.program_id(0) % tiles_m  # the M tiles of one N tile run together: its weight hits L2
    pid_n = tl.program_id(0) // tiles_m
    first = tl.program_id(1) * steps_per_split
    last = tl.minimum(first + steps_per_split, tl.cdiv(K, BLOCK_K))
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    n_ok, m_ok = offs_n < N, offs_m < M
    rows_w = tl.where(n_ok, offs_n, 0).to(tl.int64)
    rows_x = tl.where(m_ok, offs_m, 0).to(tl.int64)
    w_ptrs = w_ptr + rows_w[:, None] * stride_w + (first * BLOCK_K + ks)[None, :]
    x_offs = rows_x[:, None] * stride_x + (first * BLOCK_K + ks)[None, :]
    s_ptrs = s_ptr + (pid_n * BLOCK_N // SCALE_BN) * stride_s
    dt = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    # no kernel writes a weight: while the kernel before runs, ask L2 for the first PREFETCH K
    # steps' weight tiles, one 128-byte line per request (``PREFETCH_STEPS``)
    if PREFETCH:
        lines = tl.arange(0, BLOCK_K // 128) * 128
        for i in tl.static_range(PREFETCH):
            if first + i < last:
                cols = tl.minimum((first + i) * BLOCK_K + lines, K - 1)
                tl.inline_asm_elementwise(
                    "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                    [w_ptr + rows_w[:, None] * stride_w + cols[None, :]],
                    dtype=tl.int32, is_pure=False, pack=1)
    wait(USE_PDL)  # W8A8: the successor is released after the main loop (``pdl.py``)
    if A8 and not CHANNEL:  # the first K step's scales (x's come from the kernel before, so
        # after the wait); each step loads the next one's (below)
        xs_row = xs_ptr + rows_x * stride_xs
        step0 = first * BLOCK_K // SCALE_BK
        gs = tl.load(xs_row + step0) * tl.load(s_ptrs + step0)
    for kb in range(first, last):
        k_ok = (kb * BLOCK_K + ks < K)[None, :]
        # NOTE: padding tokens are masked: reading them as (clamped) copies of token 0 cost up to
        # 2x (M = 96 in a 128-row tile); a full tile skips the row mask
        if EVEN_M:
            x_ok = k_ok
        else:
            x_ok = m_ok[:, None] & k_ok
        if EVEN_K:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=k_ok, other=0.0)
        if GATED:
            x = load_x(x_ptr, K, x_offs, x_ok, dt, True).to(dt)
        else:
            x = tl.load(x_ptr + x_offs, mask=x_ok, other=0.0)
        if A8 and CHANNEL:  # e4m3 x e4m3 on the FP8 tensor cores, fast accumulation (NOTE below)
            acc = tl.dot(w, tl.trans(x), acc)
        elif A8:  # each K step within one block: its weight scale times its tokens' group scales,
            # loaded one step ahead (a load the MMA waits on costs a round trip per step)
            nxt = tl.minimum(kb + 1, last - 1) * BLOCK_K // SCALE_BK
            gs_next = tl.load(xs_row + nxt) * tl.load(s_ptrs + nxt)
            acc += tl.dot(w, tl.trans(x)) * gs[None, :]
            gs = gs_next
        elif CHANNEL:
            acc = tl.dot(w.to(dt), tl.trans(x), acc, input_precision=DOT_PREC)
        else:
            s = tl.load(s_ptrs + kb * BLOCK_K // SCALE_BK)
            acc += tl.dot(w.to(dt), tl.trans(x), input_precision=DOT_PREC) * s
        w_ptrs += BLOCK_K
        x_offs += BLOCK_K
    release(USE_PDL)
    if CHANNEL:
        acc *= tl.load(s_ptr + rows_w * stride_s)[:, None]
    if A8 and CHANNEL:
        acc *= tl.load(xs_ptr + rows_x)[None, :]
    out_ok = n_ok[:, None] & m_ok[None, :]
    if SPLIT:  # y_ptr: the fp32 partials [splits, M, N]
        y_ptr += tl.program_id(1).to(tl.int64) * M * N
    elif HAS_BIAS:
        acc += tl.load(b_ptr + rows_w).to(tl.float32)[:, None]
    y_ptrs = y_ptr + rows_x[None, :] * N + offs_n[:, None]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_ok)


@triton.jit
def _sum_splits_kernel(p_ptr, b_ptr, y_ptr, MN, N, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.load(p_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(p_ptr + s * MN + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=ok)


# NOTE: Hopper's FP8 MMA accumulates with fewer mantissa bits than fp32, and Triton chains it over
# all of K (CUTLASS's "FP8FastAccum" schedules, which vLLM's and SGLang's FP8 GEMMs run; and
# ``torch._scaled_mm(use_fast_accum=True)`` in ``quant.fp8_dispatch``). Adding each K step's sum to
# an fp32 accumulator (``max_num_imprecise_acc``) would narrow the error, but both are below the
# ~2.5e-2 of rounding x to e4m3 and the precise form is slower, so the accumulation stays fast
# (docs/performance.md).

# W8A8 under PDL: the K steps whose weight tiles a program asks L2 for before its wait, while the
# kernel before it (the RMSNorm or the quantization, both launching their successor at once) still
# runs. Two steps were the fastest of 0-5 offline on an H100 (docs/performance.md); as many as the
# pipeline's stages crowd the L2 the kernel before is still using.
PREFETCH_STEPS = 2


def fp8_w8a16_gemm(x: torch.Tensor, w: torch.Tensor, ws: torch.Tensor,
                   block: tuple[int, int] | None, bias: torch.Tensor | None = None,
                   gated: bool = False, config: W8A16Config | None = None) -> torch.Tensor:
    """x [M, K] (``[M, 2K]`` = [gate | up] with ``gated``) in bf16/fp16/fp32, e4m3 w [N, K],
    bias [N] -> [M, N] in x's dtype; ws [N/bn, K/bk] block scales, or with ``block=None``
    per-channel scales ws [N, 1]. Block scales need the config's tiles to divide the block."""
    n, k = w.shape
    assert x.dim() == 2 and x.shape[1] == (2 * k if gated else k) and x.stride(1) == 1
    cfg = config or pick_config(x.shape[0], n, k, gated, x.element_size(), _sms(x))
    return _launch(x, None, w, ws, block, bias, gated, cfg, x.dtype)


def fp8_w8a8_gemm(xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, ws: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                  config: W8A16Config | None = None,
                  block: tuple[int, int] | None = None, pdl: bool = False) -> torch.Tensor:
    """e4m3 xq [M, K] with per-token scales xs [M, 1] (``fp8_quant.quantize_tokens``), e4m3 w [N, K]
    with per-channel scales ws [N, 1], bias [N] -> [M, N] in ``out_dtype``: the same tiles and
    split-K, multiplied on the FP8 tensor cores. With ``block = (bn, bk)`` (FP8 checkpoints): block
    scales ws [N/bn, K/bk] and scales per token and bk columns xs [M, K/bk]
    (``fp8_gemm.quantize_act``), applied at every K step."""
    n, k = w.shape
    assert xq.dim() == 2 and xq.shape[1] == k and xq.stride(1) == 1 and xq.dtype == w.dtype
    groups = 1 if block is None else triton.cdiv(k, block[1])
    assert xs.shape == (xq.shape[0], groups) and xs.dtype == torch.float32 and xs.stride(1) == 1
    cfg = config or pick_config(xq.shape[0], n, k, x_bytes=1, sms=_sms(xq))
    return _launch(xq, xs, w, ws, block, bias, False, cfg, out_dtype, pdl)


def _sms(x: torch.Tensor) -> int:
    return sm_count(x.device) if x.is_cuda else SMS


def _launch(x: torch.Tensor, xs: torch.Tensor | None, w: torch.Tensor, ws: torch.Tensor,
            block: tuple[int, int] | None, bias: torch.Tensor | None, gated: bool,
            cfg: W8A16Config, out_dtype: torch.dtype, pdl: bool = False) -> torch.Tensor:
    n, k = w.shape
    m = x.shape[0]
    channel = block is None
    bn, bk = (1, 1) if channel else block
    assert w.is_contiguous() and w.dtype == torch.float8_e4m3fn and ws.dtype == torch.float32
    assert ws.shape == ((n, 1) if channel else (triton.cdiv(n, bn), triton.cdiv(k, bk)))
    assert ws.stride(1) == 1 or ws.shape[1] == 1
    assert bias is None or bias.shape == (n,) and bias.is_contiguous()
    if not channel:  # a tile never straddles two scale blocks
        cfg = replace(cfg, block_n=min(cfg.block_n, bn), block_k=min(cfg.block_k, bk))
        assert bn % cfg.block_n == 0 and bk % cfg.block_k == 0, \
            f"the scale block {block} must be a multiple of the tile ({cfg.block_n}, {cfg.block_k})"
    y = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return y
    steps = triton.cdiv(k, cfg.block_k)
    per = triton.cdiv(steps, cfg.split_k)
    splits = triton.cdiv(steps, per)  # no split without a K step
    assert splits * m * n < 2**31, "split-K partials are indexed in int32"
    out = y if splits == 1 else torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), splits)
    launch = (pdl_.launch_options(x, pdl) if xs is not None and splits == 1
              else {"USE_PDL": False})
    _w8a16_kernel[grid](
        x, ws if xs is None else xs, w, ws, w if bias is None else bias, out, m, n, k, per,
        x.stride(0), w.stride(0), ws.stride(0), 0 if xs is None else xs.stride(0),
        CHANNEL=channel, SCALE_BN=bn, SCALE_BK=bk,
        GATED=gated, A8=xs is not None, HAS_BIAS=bias is not None, EVEN_M=m % cfg.block_m == 0,
        EVEN_K=k % cfg.block_k == 0, SPLIT=splits > 1,
        DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        PREFETCH=PREFETCH_STEPS if launch["USE_PDL"] and cfg.block_k % 128 == 0 else 0, **launch,
    )
    if splits > 1:
        block_sum = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block_sum),)](
            out, w if bias is None else bias, y, m * n, n, SPLITS=splits,
            HAS_BIAS=bias is not None, BLOCK=block_sum, num_warps=4)
    return y
