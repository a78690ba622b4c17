"""Fused MoE: token-to-expert alignment, then two grouped GEMMs over the experts' padded row blocks.

1. Alignment (three small kernels, no host sync): count the (token, k) pairs per expert, pad each
   expert's segment to ``BLOCK_M`` rows, and scatter the pair ids into their expert's segment.
   ``expert_ids[b]`` names the expert of row block ``b``; padding rows hold the sentinel ``T * K``.
   The order of pairs inside a segment comes from atomics and is not fixed, but every row is
   computed on its own and written to its pair's slot, so the result is deterministic.
2. GEMM 1 (gate and up together, SiLU-and-mul in the epilogue): each program takes one ``BLOCK_M``
   block of one expert's rows, gathers the token rows of x and multiplies by the gate and the up
   rows of ``w13[e]``, writing ``silu(gate) * up`` [T*K, I] by pair id. The [T*K, 2I] tensor never
   exists.
3. GEMM 2: the same over ``w2[e]``, times the pair's routing weight, into a [T, K, H] buffer that is
   summed over K (fp32 accumulation, in a fixed order).

Every buffer is sized from T, K, E and the block size alone, and the grids over row blocks are the
worst case (programs past the padded total return at once), so the whole path is CUDA-graph safe.
Intermediate roundings follow the torch reference backend (``moe/reference.py``).

FP8 experts (``scales`` given): the weights are read as e4m3, half the bytes, and each tile is
scaled by its block's ``scale_inv`` and cast to x's dtype in registers before the dot (weight-only:
the activations stay in bf16, so nothing changes for the routing or the roundings above).
``BLOCK_K`` is capped at the block's column width, so a K step meets one scale per output column.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .activation import silu_mul


@dataclass(frozen=True)
class MoeConfig:
    block_m: int
    block_n1: int  # columns of I per program in GEMM 1 (gate and up each)
    block_n2: int  # columns of H per program in GEMM 2
    block_k: int
    group_m: int = 8  # row blocks that walk the N tiles together, so their rows stay in L2
    num_warps: int = 4
    num_stages: int = 4


def pick_config(num_pairs: int, num_experts: int) -> MoeConfig:
    """Block sizes by expected rows per expert: small blocks when each expert sees a few rows
    (decode is weight-bandwidth bound: more programs in flight), tensor-core sized tiles in
    prefill."""
    rows = num_pairs / num_experts  # picked from sweeps on an H100 (benchmark/kernels/bench_moe.py)
    if rows <= 4:  # narrow GEMM-1 tiles: with T=1 there are only top_k row blocks to spread
        return MoeConfig(16, 32, 64, 256, 1, 4, 3)
    if rows <= 32:
        return MoeConfig(32, 64, 64, 128, 4, 4, 4)
    if rows <= 128:
        return MoeConfig(64, 128, 128, 64, 8, 4, 3)
    return MoeConfig(128, 128, 256, 64, 8, 8, 3)


def padded_capacity(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Rows after padding, worst case: every non-empty expert wastes up to ``block_m - 1`` rows."""
    return triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m) * block_m


# ---------------------------------------------------------------- alignment


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    tl.atomic_add(counts_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=mask)


@triton.jit
def _offsets_kernel(ids_ptr, counts_ptr, expert_ids_ptr, sorted_ptr, total_ptr, n_experts, n_pairs,
                    n_blocks, capacity, COUNT: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_B: tl.constexpr,
                    FILL: tl.constexpr):
    """One program: padded segment starts (left in ``counts`` as the scatter cursors), the padded
    total, each row block's expert, and the sentinel fill of ``sorted``. With COUNT (small batches,
    i.e. decode) it also counts the pairs per expert itself, saving a memset and a launch."""
    e = tl.arange(0, BLOCK_E)
    e_ok = e < n_experts
    if COUNT:
        cnt = tl.zeros([BLOCK_E], dtype=tl.int32)
        for p0 in range(0, n_pairs, BLOCK_P):
            p = p0 + tl.arange(0, BLOCK_P)
            ids = tl.load(ids_ptr + p, mask=p < n_pairs, other=-1)
            cnt += tl.sum((ids[:, None] == e[None, :]).to(tl.int32), 0)
    else:
        cnt = tl.load(counts_ptr + e, mask=e_ok, other=0)
    padded = (cnt + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    tl.store(counts_ptr + e, ends - padded, mask=e_ok)
    tl.store(total_ptr, tl.sum(padded, 0))
    for b0 in range(0, n_blocks, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        # a block's expert = how many segments end at or before the block's first row
        owned = (ends[None, :] <= (b * BLOCK_M)[:, None]) & e_ok[None, :]
        tl.store(expert_ids_ptr + b, tl.sum(owned.to(tl.int32), 1), mask=b < n_blocks)
    for i0 in range(0, capacity, FILL):
        i = i0 + tl.arange(0, FILL)
        tl.store(sorted_ptr + i, tl.full([FILL], 0, tl.int32) + n_pairs, mask=i < capacity)


@triton.jit
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    e = tl.load(ids_ptr + offs, mask=mask, other=0)
    slot = tl.atomic_add(cursor_ptr + e, tl.full([BLOCK], 1, tl.int32), mask=mask)
    tl.store(sorted_ptr + slot, offs.to(tl.int32), mask=mask)


_INLINE_COUNT_PAIRS = 256  # up to here one program counts (a few loop steps) instead of atomics


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (sorted pair ids [capacity] int32, expert of each row block [capacity / block_m] int32,
    padded total [1] int32). Pair id = token * K + k; padding rows hold ``T * K``."""
    ids = topk_ids.reshape(-1)
    n = ids.numel()
    cap = padded_capacity(n, num_experts, block_m)
    dev = topk_ids.device
    count_inline = n <= _INLINE_COUNT_PAIRS
    counts = (torch.empty if count_inline else torch.zeros)(
        num_experts, dtype=torch.int32, device=dev)
    sorted_ids = torch.empty(cap, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(cap // block_m, dtype=torch.int32, device=dev)
    total = torch.empty(1, dtype=torch.int32, device=dev)
    grid = (triton.cdiv(n, 256),)
    if not count_inline:
        _count_kernel[grid](ids, counts, n, BLOCK=256)
    _offsets_kernel[(1,)](ids, counts, expert_ids, sorted_ids, total, num_experts, n,
                          cap // block_m, cap, COUNT=count_inline, BLOCK_M=block_m,
                          BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_P=64, BLOCK_B=32,
                          FILL=1024)
    _scatter_kernel[grid](ids, counts, sorted_ids, n, BLOCK=256)
    return sorted_ids, expert_ids, total


# ---------------------------------------------------------------- grouped GEMMs


@triton.jit
def _tile(n_tiles_n, n_blocks_m, GROUP_M: tl.constexpr):
    """Grouped program order: GROUP_M row blocks (about one expert) sweep all N tiles together."""
    pid = tl.program_id(0)
    width = GROUP_M * n_tiles_n
    first = (pid // width) * GROUP_M
    size = tl.minimum(n_blocks_m - first, GROUP_M)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr,
    n_pairs, n_out, k_dim, top_k, n_blocks_m,
    stride_am, stride_we, stride_wn, stride_om, stride_se, stride_sn,
    GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    FP8_W: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
):
    """GATED: out[pair, n] = silu(a[tok] . w[e, n]) * (a[tok] . w[e, n_out + n])
              (a = x, rows by token)
    else:     out[pair, n] = (a[pair] . w[e, n]) * weights[pair]
              (a = act, rows by pair)"""
    pid_m, pid_n = _tile(tl.cdiv(n_out, BLOCK_N), n_blocks_m, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < n_pairs
    pair = tl.where(valid, pair, 0).to(tl.int64)  # padding rows read row 0; never stored
    row = pair // top_k  # GEMM 1 gathers token rows of x; GEMM 2 passes top_k=1 (pair rows)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_out
    offs_n_safe = tl.where(n_ok, offs_n, 0)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + row[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n_safe[None, :] * stride_wn + offs_k[:, None]
    s_ptrs = ws_ptr + expert * stride_se + (offs_n_safe // SCALE_BN) * stride_sn
    s_up_ptrs = ws_ptr + expert * stride_se + ((offs_n_safe + n_out) // SCALE_BN) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(tl.cdiv(k_dim, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_ok = offs_k < k_dim - k * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        if FP8_W:
            kb = k * BLOCK_K // SCALE_BK
            w = (w.to(tl.float32) * tl.load(s_ptrs + kb)[None, :]).to(a.dtype)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
        if GATED:
            if EVEN_K:
                w_up = tl.load(w_ptrs + n_out * stride_wn)
            else:
                w_up = tl.load(w_ptrs + n_out * stride_wn, mask=k_ok[:, None], other=0.0)
            if FP8_W:
                w_up = (w_up.to(tl.float32) * tl.load(s_up_ptrs + kb)[None, :]).to(a.dtype)
            acc_up = tl.dot(a, w_up, acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    dt = out_ptr.dtype.element_ty
    if GATED:
        res = silu_mul(acc.to(dt).to(tl.float32), acc_up.to(dt).to(tl.float32), dt)
    else:
        rw = tl.load(weights_ptr + pair, mask=valid, other=0.0).to(tl.float32)
        res = (acc.to(dt).to(tl.float32) * rw[:, None]).to(dt)
    tl.store(out_ptr + pair[:, None] * stride_om + offs_n[None, :], res,
             mask=valid[:, None] & n_ok[None, :])


def _gemm(a, w, out, weights, sorted_ids, expert_ids, total, n_pairs, top_k, gated, block_n, cfg,
          w_scale=None, block=(1, 1)):
    n_out = w.shape[1] // 2 if gated else w.shape[1]
    k_dim = w.shape[2]
    n_blocks_m = sorted_ids.numel() // cfg.block_m
    block_k = min(cfg.block_k, max(16, triton.next_power_of_2(k_dim)))
    if w_scale is not None:
        block_k = min(block_k, block[1])
    block_n = min(block_n, max(16, triton.next_power_of_2(n_out)))
    grid = (n_blocks_m * triton.cdiv(n_out, block_n),)
    fp8 = w_scale is not None
    _moe_gemm_kernel[grid](
        a, w, out, weights, sorted_ids, expert_ids, total, w_scale if fp8 else a,
        n_pairs, n_out, k_dim, top_k, n_blocks_m,
        a.stride(0), w.stride(0), w.stride(1), out.stride(0),
        w_scale.stride(0) if fp8 else 0, w_scale.stride(1) if fp8 else 0,
        GATED=gated, BLOCK_M=cfg.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        GROUP_M=cfg.group_m, EVEN_K=k_dim % block_k == 0,
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        FP8_W=fp8, SCALE_BN=block[0], SCALE_BK=block[1],
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, config: MoeConfig | None = None,
              scales: tuple[torch.Tensor, torch.Tensor, tuple[int, int]] | None = None
              ) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_* [T, K] -> [T, H].
    ``scales``: (w13_scale_inv, w2_scale_inv, block) when w13/w2 are e4m3."""
    tokens, hidden = x.shape
    n_experts, two_i, _ = w13.shape
    top_k = topk_ids.shape[1]
    assert w13.shape[2] == hidden and w2.shape == (n_experts, hidden, two_i // 2)
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1
    n_pairs = tokens * top_k
    if n_pairs == 0:
        return torch.zeros_like(x)
    cfg = config or pick_config(n_pairs, n_experts)
    if x.element_size() == 4:  # fp32 tiles are twice the bytes: keep within shared memory
        cfg = replace(cfg, block_k=min(cfg.block_k, 32), num_stages=min(cfg.num_stages, 2))
    sorted_ids, expert_ids, total = moe_align(topk_ids, n_experts, cfg.block_m)
    act = torch.empty((n_pairs, two_i // 2), dtype=x.dtype, device=x.device)
    s13, s2, block = scales if scales is not None else (None, None, (1, 1))
    if s13 is not None:
        assert s13.stride(2) == 1 and s2.stride(2) == 1
    _gemm(x, w13, act, act, sorted_ids, expert_ids, total, n_pairs, top_k, True, cfg.block_n1, cfg,
          s13, block)
    out = torch.empty((n_pairs, hidden), dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1)
    if not weights.is_contiguous():
        weights = weights.contiguous()
    _gemm(act, w2, out, weights, sorted_ids, expert_ids, total, n_pairs, 1, False,
          cfg.block_n2, cfg, s2, block)
    return out.view(tokens, top_k, hidden).sum(dim=1)
