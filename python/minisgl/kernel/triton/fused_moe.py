"""Fused MoE: token-to-expert alignment, then two grouped GEMMs over the experts' padded row blocks.

1. Alignment (``moe_align``): every (token, k) pair lands in its expert's segment, padded to
   ``BLOCK_M`` rows; ``expert_ids[b]`` names the expert of row block ``b``. MXFP4's GEMVs (row
   blocks of one) skip it: a program a pair, in pair order, its expert the pair's top-k id.
2. GEMM 1 (gate and up together, the activation in the epilogue): each program takes one
   ``BLOCK_M`` block of one expert's rows, gathers the token rows of x and multiplies by the gate
   and the up rows of ``w13[e]``, adds the expert's biases (gpt-oss), and writes
   ``act(gate, up)`` [T*K, I] by pair id (``silu(gate) * up``, gpt-oss's clamped SwiGLU, or
   Gemma's ``gelu_tanh(gate) * up``). The [T*K, 2I] tensor never exists.
3. GEMM 2: the same over ``w2[e]`` (plus its bias), times the pair's routing weight, into a
   [T, K, H] buffer that is summed over K (fp32 accumulation, in a fixed order).

With ``pdl`` every kernel of the chain (alignment, GEMMs, the sum) launches while the one before
it finishes and waits before its first read (``pdl.py``): at batch 1 the experts' work is a few
microseconds a kernel, about what a launch and the programs' start-up cost.

Every buffer is sized from T, K, E and the block size alone, and the grids over row blocks are the
worst case (programs past the padded total return at once), so the whole path is CUDA-graph safe.
Intermediate roundings follow the torch reference backend (``moe/reference.py``).

Quantized experts are decoded in registers before the dot (weight-only: the activations stay in
x's dtype, so nothing changes for the routing or the roundings above):

- FP8 (``scales`` a tuple): the weights are read as e4m3 and each tile is scaled by its block's
  ``scale_inv``; ``BLOCK_K`` is capped at the block's column width, so a K step meets one scale
  per output column.
- MXFP4 (``Mxfp4Scales``, ``moe_mxfp4``): a byte holds two values (a quarter of bf16's weight
  bytes, the win of decode), the bits of each 32-bit word permuted at load time
  (``quant.mxfp4.to_words``) so that the kernels decode them by rotations and masks; the row
  block picks one of three kernels (a GEMV for blocks of one row, group-scaled partial sums up
  to 32 rows, swapped operands beyond), and ``moe_configs`` the tiles tuned per GPU.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from minisgl.kernel import aligned16
from minisgl.kernel.moe_types import SILU, ExpertBias, FragmentScales, MoeActivation, Mxfp4Scales

from . import pdl as pdl_
from .moe_align import moe_align, padded_capacity
from .moe_configs import MoeConfig, pick_config
from .moe_mxfp4 import moe_gemm_mx_kernel, moe_gemm_mx_wide_kernel, mx_groups
from .moe_mxfp4_frag import frag_tile, launch_frag, takes_gluon
from .moe_mxfp4_gemv import moe_gemv_mx_kernel
from .moe_tiles import epilogue, tile, tile_rows
from .pdl import hopper_compiled, wait_then_release

__all__ = ["MoeConfig", "fused_moe", "moe_align", "padded_capacity", "pick_config"]


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, k_dim, top_k, n_blocks_m, alpha, limit,
    stride_am, stride_we, stride_wn, stride_om, stride_se, stride_sn, stride_be,
    GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
    FP8_W: tl.constexpr, SCALE_BN: tl.constexpr, SCALE_BK: tl.constexpr,
    HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr, GELU: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    """GATED: out[pair, n] = act(a[tok] . w[e, n], a[tok] . w[e, n_out + n])
              (a = x, rows by token)
    else:     out[pair, n] = (a[pair] . w[e, n]) * weights[pair]
              (a = act, rows by pair)"""
    wait_then_release(USE_PDL)
    pid_m, pid_n = tile(tl.cdiv(n_out, BLOCK_N), n_blocks_m, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    pair, valid, row, expert, offs_n, n_ok, offs_n_safe = tile_rows(
        sorted_ptr, expert_ids_ptr, pid_m, pid_n, n_pairs, top_k, n_out, BLOCK_M, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + row[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n_safe[None, :] * stride_wn + offs_k[:, None]
    s_ptrs = ws_ptr + expert * stride_se + (offs_n_safe // SCALE_BN) * stride_sn
    s_up_ptrs = ws_ptr + expert * stride_se + ((offs_n_safe + n_out) // SCALE_BN) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(tl.cdiv(k_dim, BLOCK_K)):
        if EVEN_K:  # a padding row's x is not read (zeros; its outputs are not stored)
            a = tl.load(a_ptrs, mask=valid[:, None], other=0.0)
            w = tl.load(w_ptrs)
        else:
            k_ok = offs_k < k_dim - k * BLOCK_K
            a = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
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
    epilogue(acc, acc_up, out_ptr, weights_ptr, bias_ptr, pair, valid, expert, offs_n, n_ok,
             offs_n_safe, n_out, stride_om, stride_be, alpha, limit, GATED, HAS_BIAS, CLAMPED,
             GELU)


# the swapped MXFP4 kernel's tiles in the permuted operand order where they fit
# (``permuted_tile``); ``tune_moe.py --unpermuted`` turns it off to compare
PERMUTE = True


def permuted_tile(block_m: int, block_n: int, block_k: int, warps: int, gated: bool) -> bool:
    """Whether the swapped kernel's tile takes the permuted operand order
    (``moe_mxfp4._operand_order``): x's K step then passes through registers, beside the decoded
    weights and the accumulators; past about 192 values a thread the registers spill (the tiles'
    machine code, ``benchmark/kernels/sass_moe.py``), where K order leaves x in shared memory."""
    threads = 32 * warps
    held = (block_n + block_m) * block_k // 2 + (2 if gated else 1) * block_n * block_m
    return PERMUTE and block_k % 64 == 0 and held <= 192 * threads


def _ptx_decode(a: torch.Tensor) -> bool:
    """MXFP4 tiles decode in PTX (``mxfp4.decode_words_bf16``: Hopper's packed bf16 multiply)
    for bf16 activations on sm_90 and later."""
    return a.dtype == torch.bfloat16 and a.is_cuda and hopper_compiled(a.device.index or 0)


def _gemm(a, w, out, weights, sorted_ids, expert_ids, total, n_pairs, top_k, gated, block_n, cfg,
          w_scale=None, block=(1, 1), mx=False, bias=None, act=SILU, pdl=False, frag=False,
          gluon=False):
    k_dim = w.shape[2] * (2 if mx else 1)
    n_out = w.shape[1] // 2 if gated else w.shape[1]
    n_blocks_m = n_pairs if sorted_ids is None else sorted_ids.numel() // cfg.block_m
    block_k = min(cfg.block_k, max(32 if mx else 16, triton.next_power_of_2(k_dim)))
    if w_scale is not None and not mx:
        block_k = min(block_k, block[1])
    block_n = min(block_n, max(16, triton.next_power_of_2(n_out)))
    grid = (n_blocks_m * triton.cdiv(n_out, block_n),)
    scaled = w_scale is not None
    args = (a, w, out, weights, sorted_ids, expert_ids, total, w_scale if scaled else a,
            bias if bias is not None else a, n_pairs, n_out, k_dim, top_k, n_blocks_m,
            act.alpha, act.limit, a.stride(0), w.stride(0), w.stride(1), out.stride(0),
            w_scale.stride(0) if scaled else 0, w_scale.stride(1) if scaled else 0,
            bias.stride(0) if bias is not None else 0)
    meta = dict(GATED=gated, BLOCK_M=cfg.block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                GROUP_M=cfg.group_m, EVEN_K=k_dim % block_k == 0,
                PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
                HAS_BIAS=bias is not None, CLAMPED=act.kind == "swiglu_clamped",
                GELU=act.kind == "gelu_tanh",
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
                **pdl_.launch_options(a, pdl))
    if mx:  # 32-bit word loads, 4 a group: the kernels take the alignment as given
        assert aligned16(w) and w.stride(0) % 16 == 0 and w.stride(1) % 16 == 0, \
            "MXFP4 experts' bytes must be 16-byte aligned, rows included"
    if frag:
        if gluon:
            meta.update(AHEAD=cfg.gluon_ahead, SPLIT=cfg.gluon_split, MMA=cfg.gluon_mma,
                        W_STAGED=cfg.gluon_staged, WS=cfg.gluon_ws, HALVES=cfg.gluon_halves)
        launch_frag(grid, args, meta, cfg.block_m == 1, block_n, block_k, k_dim, _ptx_decode(a),
                    gluon)
    elif mx and cfg.block_m == 1:
        for name in ("BLOCK_M", "GROUP_M", "PRECISION"):
            del meta[name]
        moe_gemv_mx_kernel[grid](*args, **meta)
    elif mx and (cfg.swapped if cfg.swapped is not None else cfg.block_m > 32):
        permute = permuted_tile(cfg.block_m, block_n, block_k, cfg.num_warps, gated)
        moe_gemm_mx_wide_kernel[grid](*args, FAST=_ptx_decode(a), PERMUTE=permute, **meta)
    elif mx:
        del meta["BLOCK_K"], meta["EVEN_K"]
        moe_gemm_mx_kernel[grid](*args, GROUPS=mx_groups(k_dim, cfg.block_k),
                                 FAST=_ptx_decode(a), **meta)
    else:
        _moe_gemm_kernel[grid](*args, FP8_W=scaled, SCALE_BN=block[0], SCALE_BK=block[1], **meta)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, config: MoeConfig | None = None,
              scales: tuple[torch.Tensor, torch.Tensor, tuple[int, int]] | Mxfp4Scales | None
              = None, bias: ExpertBias | None = None, act: MoeActivation = SILU,
              pdl: bool = False) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_* [T, K] -> [T, H].
    ``scales``: (w13_scale_inv, w2_scale_inv, block) when w13/w2 are e4m3; ``Mxfp4Scales`` when
    they are packed MXFP4 in the word layout (``quant.mxfp4.to_words`` of the checkpoint's
    ``w13 [E, 2I, H/2]``, ``w2 [E, H, I/2]`` uint8; 16-byte aligned). ``bias``/``act``: see
    ``minisgl.kernel.moe_types``; ``pdl``: ``pdl.py``."""
    tokens, hidden = x.shape
    mx = isinstance(scales, Mxfp4Scales)
    n_experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    unpacked = 2 if mx else 1
    assert w13.shape[2] * unpacked == hidden and w2.shape == (n_experts, hidden, inter // unpacked)
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1
    n_pairs = tokens * top_k
    if n_pairs == 0:
        return torch.zeros_like(x)
    fmt = "mxfp4" if mx else "fp8" if scales is not None else "bf16"
    cfg = config or pick_config(n_pairs, n_experts, mx, (fmt, two_i, hidden), x.device)
    if x.element_size() == 4:  # fp32 tiles are twice the bytes: keep within shared memory
        cfg = replace(cfg, block_k=min(cfg.block_k, 32), num_stages=min(cfg.num_stages, 2))
    frag = isinstance(scales, FragmentScales)
    gluon = frag and takes_gluon(scales, x, _ptx_decode(x), act)
    if frag and config is None:
        cfg = MoeConfig(*frag_tile(n_pairs / n_experts, gluon, (two_i, hidden), x.device))
    gluon = gluon and cfg.gluon
    if frag and config is not None:  # the GEMV, or wgmma tiles of 16 rows or more (Gluon's: 8)
        least = (1 if cfg.gluon_mma else 8) if gluon else 16
        cfg = replace(cfg, block_m=cfg.block_m if cfg.block_m == 1 else max(cfg.block_m, least),
                      block_n1=max(cfg.block_n1, 16), block_n2=max(cfg.block_n2, 16),
                      num_stages=cfg.num_stages if cfg.block_m <= 32 or gluon
                      else min(cfg.num_stages, 2))
    if mx and cfg.block_m == 1:  # the GEMVs and the mma.sync kernel's one-pair blocks: no alignment
        sorted_ids, expert_ids, total = None, topk_ids.reshape(-1), None
    else:
        sorted_ids, expert_ids, total = moe_align(topk_ids, n_experts, cfg.block_m, pdl)
    act_out = torch.empty((n_pairs, inter), dtype=x.dtype, device=x.device)
    if mx:
        s13, s2, block = scales.w13, scales.w2, (1, 1)
    else:
        s13, s2, block = scales if scales is not None else (None, None, (1, 1))
    if s13 is not None:
        assert s13.stride(2) == 1 and s2.stride(2) == 1
    b13, b2 = bias if bias is not None else (None, None)
    _gemm(x, w13, act_out, act_out, sorted_ids, expert_ids, total, n_pairs, top_k, True,
          cfg.block_n1, cfg, s13, block, mx, b13, act, pdl, frag, gluon)
    out = torch.empty((n_pairs, hidden), dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1)
    if not weights.is_contiguous():
        weights = weights.contiguous()
    _gemm(act_out, w2, out, weights, sorted_ids, expert_ids, total, n_pairs, 1, False,
          cfg.block_n2, cfg, s2, block, mx, b2, pdl=pdl, frag=frag, gluon=gluon)
    if top_k == 1:
        return out
    summed = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    block_h = min(1024, triton.next_power_of_2(hidden))
    _sum_kernel[(tokens, triton.cdiv(hidden, block_h))](out, summed, hidden, K=top_k,
                                                        BLOCK=block_h,
                                                        **pdl_.launch_options(x, pdl))
    return summed


@triton.jit
def _sum_kernel(src_ptr, out_ptr, hidden, K: tl.constexpr, BLOCK: tl.constexpr,
                USE_PDL: tl.constexpr):
    """out[t] = the sum of src[t, 0 .. K-1] (float32, in k's order), in out's dtype."""
    wait_then_release(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(K):
        acc += tl.load(src_ptr + (t * K + k) * hidden + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * hidden + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)
