"""Block-scaled FP8 GEMM for prefill and batched decode:
``y = dequant(xq, xs) @ dequant(wq, ws)^T``.

Operands in the format of the published FP8 checkpoints (``minisgl.quant.fp8``)::

    xq [M, K] e4m3, xs [M, K/bk] fp32        one scale per token and bk columns (``quantize_act``)
    wq [N, K] e4m3, ws [N/bn, K/bk] fp32     one scale per bn x bk block (``weight_scale_inv``)

``BLOCK_K == bk``, so each K step multiplies two e4m3 tiles on the FP8 tensor cores (fp32 result)
and adds it to the fp32 accumulator times ``xs[:, kb] (x) ws[n // bn, kb]``: the scales cost one
multiply per accumulator element and step, the bytes half those of bf16. Tiles are visited in groups
of ``GROUP_M`` row blocks so that the weight tiles a group shares stay in L2.

``quantize_act`` is the dynamic activation quantization: each group's absolute maximum maps onto 448
(a program takes up to 1,024 columns of one token); ``gated=True`` first forms ``silu(gate) * up``
from ``[gate | up]`` (rounded as ``silu_and_mul`` rounds), so the MLP's activation costs no extra
pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .fp8_quant import fp8_scale, load_act, saturate


@triton.jit
def _quantize_act_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_sm, stride_sg,
                         GATED: tl.constexpr, GROUP: tl.constexpr, GROUPS: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    gs = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = gs[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    ok = cols < K
    x = load_act(x_ptr + m * stride_x, cols, ok, K, GATED)
    scale = fp8_scale(tl.max(tl.abs(x), 1))
    tl.store(q_ptr + m * stride_q + cols,
             saturate(x, scale[:, None]).to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + m * stride_sm + gs * stride_sg, scale, mask=gs * GROUP < K)


def quantize_act(x: torch.Tensor, group: int, gated: bool = False, column_major: bool = False,
                 rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (``[M, 2K]`` = [gate | up] with ``gated``) -> (e4m3 ``[M, K]``, fp32
    ``[M, K/group]``; ``column_major``: its transpose's storage, as ``torch._scaled_mm``'s
    block-wise scaling takes it). ``rows >= M``: both outputs that tall, the rows past M zero.
    A program quantizes up to 1,024 columns of a token (one 128-column group a program left each
    token's row waiting on 32-96 programs' loads)."""
    m, width = x.shape
    k = width // 2 if gated else width
    assert x.stride(1) == 1 and group & (group - 1) == 0
    rows = m if rows is None else rows
    new = torch.empty if rows == m else torch.zeros
    q = new((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    g = triton.cdiv(k, group)
    s = new((g, rows), dtype=torch.float32, device=x.device).t() if column_major else \
        new((rows, g), dtype=torch.float32, device=x.device)
    if m:
        per = min(triton.next_power_of_2(g), max(1, 1024 // group))
        _quantize_act_kernel[(m, triton.cdiv(g, per))](
            x, q, s, k, x.stride(0), q.stride(0), s.stride(0), s.stride(1), GATED=gated,
            GROUP=group, GROUPS=per, num_warps=max(1, min(4, per * group // 256)))
    return q, s


@triton.jit
def _fp8_gemm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K,
                     stride_am, stride_as, stride_bn, stride_bs, stride_cm,
                     SCALE_BN: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    width = GROUP_M * tiles_n
    first = (pid // width) * GROUP_M
    size = tl.minimum(tiles_m - first, GROUP_M)
    pid_m = first + (pid % width) % size
    pid_n = (pid % width) // size

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m < M, offs_n < N
    rows = tl.where(m_ok, offs_m, 0).to(tl.int64)
    cols = tl.where(n_ok, offs_n, 0).to(tl.int64)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + cols[None, :] * stride_bn + offs_k[:, None]
    as_ptrs = as_ptr + rows * stride_as
    bs_ptrs = bs_ptr + (cols // SCALE_BN) * stride_bs
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k < K - kb * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
        a_s = tl.load(as_ptrs + kb)
        b_s = tl.load(bs_ptrs + kb)
        acc += tl.dot(a, b) * a_s[:, None] * b_s[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


def pick_config(m: int, n: int, k: int) -> GemmConfig:
    """Tiles by the number of tokens: narrow M tiles for batched decode (weight-bandwidth bound,
    many programs), tensor-core sized ones for prefill. A starting point for
    ``benchmark/kernels/bench_fp8.py --sweep`` on the GPU, not a measured optimum."""
    if m <= 16:
        return GemmConfig(16, 64, 1, 4, 4)
    if m <= 64:
        return GemmConfig(32, 64, 4, 4, 4)
    if m <= 256:
        return GemmConfig(64, 128, 8, 4, 3)
    return GemmConfig(128, 128, 8, 8, 3)


def fp8_block_gemm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
                   block: tuple[int, int], out_dtype: torch.dtype,
                   config: GemmConfig | None = None) -> torch.Tensor:
    """``[M, N]`` in ``out_dtype``; shapes as in the module docstring."""
    m, k = xq.shape
    n = wq.shape[0]
    bn, bk = block
    if bk < 32 and xq.is_cuda:  # each K step is one FP8 tensor-core dot, which needs K >= 32
        raise ValueError(f"weight_block_size: blocks of {bk} columns are too narrow for the FP8 "
                         "GEMM on the GPU (at least 32; published checkpoints use 128)")
    assert wq.shape[1] == k and xq.stride(1) == 1 and wq.stride(1) == 1
    assert (xs.shape == (m, triton.cdiv(k, bk))
            and ws.shape == (triton.cdiv(n, bn), triton.cdiv(k, bk)))
    assert xs.stride(1) == 1 and ws.stride(1) == 1
    out = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    cfg = config or pick_config(m, n, k)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _fp8_gemm_kernel[grid](
        xq, xs, wq, ws, out, m, n, k,
        xq.stride(0), xs.stride(0), wq.stride(0), ws.stride(0), out.stride(0),
        SCALE_BN=bn, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=bk, GROUP_M=cfg.group_m,
        EVEN_K=k % bk == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out
