"""The pieces every fused-MoE GEMM shares (``fused_moe``, ``moe_mxfp4``): the grouped program
order, a program's rows and columns, and the epilogue (biases, activation or routing weight, the
store by pair id)."""

from __future__ import annotations

import triton
import triton.language as tl

from .activation import gelu_tanh_mul, silu_mul


@triton.jit
def tile(n_tiles_n, n_blocks_m, GROUP_M: tl.constexpr):
    """Grouped program order: GROUP_M row blocks (about one expert) sweep all N tiles together."""
    pid = tl.program_id(0)
    width = GROUP_M * n_tiles_n
    first = (pid // width) * GROUP_M
    size = tl.minimum(n_blocks_m - first, GROUP_M)
    return first + (pid % width) % size, (pid % width) // size


@triton.jit
def tile_rows(sorted_ptr, expert_ids_ptr, pid_m, pid_n, n_pairs, top_k, n_out,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's pairs, their x rows, its expert and output columns; without ``sorted_ptr``
    (None) row blocks of one in pair order, ``expert_ids_ptr`` each pair's expert (the top-k ids:
    ``fused_moe``'s GEMVs, which need no alignment)."""
    if sorted_ptr is None:
        pair = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    else:
        pair = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pair < n_pairs
    pair = tl.where(valid, pair, 0).to(tl.int64)  # padding: row 0 (tiles mask it), never stored
    row = pair // top_k  # GEMM 1 gathers token rows of x; GEMM 2 passes top_k=1 (pair rows)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n_out
    return pair, valid, row, expert, offs_n, n_ok, tl.where(n_ok, offs_n, 0)


@triton.jit
def epilogue(acc, acc_up, out_ptr, weights_ptr, bias_ptr, pair, valid, expert, offs_n, n_ok,
              offs_n_safe, n_out, stride_om, stride_be, alpha, limit, GATED: tl.constexpr,
              HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr, GELU: tl.constexpr):
    """Bias, activation (GATED) or routing weight, store by pair id."""
    dt = out_ptr.dtype.element_ty
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_n_safe
        acc += tl.load(b_ptrs).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(b_ptrs + n_out).to(tl.float32)[None, :]
    gate = acc.to(dt).to(tl.float32)
    if GATED:
        up = acc_up.to(dt).to(tl.float32)
        if CLAMPED:
            gate = tl.minimum(gate, limit)
            up = tl.minimum(tl.maximum(up, -limit), limit)
            res = ((up + 1.0) * (gate / (1.0 + tl.exp(-alpha * gate)))).to(dt)
        elif GELU:
            res = gelu_tanh_mul(gate, up, dt)
        else:
            res = silu_mul(gate, up, dt)
    else:
        rw = tl.load(weights_ptr + pair, mask=valid, other=0.0).to(tl.float32)
        res = (gate * rw[:, None]).to(dt)
    tl.store(out_ptr + pair[:, None] * stride_om + offs_n[None, :], res,
             mask=valid[:, None] & n_ok[None, :])
