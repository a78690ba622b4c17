"""The fragment layout's swapped MXFP4 GEMM in Gluon (Triton's explicit-layout dialect): the
same work as ``moe_mxfp4_frag.moe_gemm_mx_frag_kernel``, without a CTA barrier a K unit.

The Triton kernel stages x and the words through shared memory every 64-deep K unit, and its
warps meet at a barrier each unit. Here each thread loads its 16 bytes of a unit straight into
its registers ``AHEAD`` units ahead (a ring of register sets, the K loop unrolled by ``AHEAD +
1`` so that no register is copied), decodes them where they land (they are the wgmma A operand
as loaded: ``convert_layout(..., assert_trivial=True)`` proves it at compile time) and
multiplies them by x's unit in shared memory, one unit's wgmmas left in flight. x, the block's
rows, is either copied to shared memory once, all of K (``X_STAGES`` 1: 46 KB for 8 rows at
K = 2,880, no barrier after the first wgmma), or goes through a ring of ``X_STAGES`` stages of
``X_UNITS`` units, ``X_STAGES - 2`` in flight, with one CTA barrier a stage (``x_stages`` picks
from a tile's ``block_k`` and ``num_stages``), which lets row blocks of 16 to 128 keep several
programs an SM. The instruction counts, registers and timings are in docs/performance.md
(``benchmark/kernels/sass_moe.py --kernel gluon`` counts them). Its epilogue is
``moe_tiles.epilogue``'s: biases, the clamped SwiGLU (gpt-oss's) or the routing weight, stored
by pair id; other activations take the Triton kernel (``moe_mxfp4_frag.takes_gluon``).
"""

from __future__ import annotations

import torch
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .moe_mxfp4 import UNDER, UNDER_SHIFT
from .mxfp4 import DECODE_WORDS_BF16

# Triton 3.6 names the cp.async copy async_copy_global_to_shared and the CTA barrier
# thread_barrier, later versions async_load and barrier
_cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _unit_tile(words, s, BLOCK_N: gl.constexpr, a_layout: gl.constexpr):
    """A unit's words and scales [NB, 8 (r), 4 (q), 4 (h, g)] -> the wgmma A operand
    [BLOCK_N, 64] (times 2 ** -64), in its register layout as decoded."""
    NB: gl.constexpr = BLOCK_N // 16
    hg = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(
        2, words.type.layout))))
    byte = (s[:, :, :, None] >> (8 * hg[None, None, None, :])) & 0xFF
    mult = (byte + (126 - UNDER_SHIFT)) * 0x00800080  # the bf16 pair (2 ** e, 2 ** e)
    v = gl.inline_asm_elementwise(DECODE_WORDS_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                  [words, mult], dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    # a join's new dimension is the last: value 4 j1 + 2 j0 + p of pair (j1, j0) -> [.., p, j0, j1]
    t = gl.join(gl.join(gl.join(v[0], v[1]), gl.join(v[2], v[3])),
                gl.join(gl.join(v[4], v[5]), gl.join(v[6], v[7])))
    t = gl.reshape(t, (NB, 8, 4, 2, 2, 2, 2, 2))  # [nb, r, q, h, g, p, j0, j1]
    # row 16 nb + 8 h + r, K 32 g + 16 j1 + 8 j0 + 2 q + p
    t = gl.permute(t, (0, 3, 1, 4, 7, 6, 2, 5))
    return gl.convert_layout(gl.reshape(t, (BLOCK_N, 64)), a_layout, assert_trivial=True)


@gluon.jit
def _unit_loads(w_ptrs, s_ptrs, up_w, up_s, u, GATED: gl.constexpr):
    """Unit ``u``'s words [NB, 8, 4, 4] and scale words [NB, 8, 4], gate rows then up rows (the
    gate rows' again where not ``GATED``)."""
    w = gl.load(w_ptrs + u * 128)
    s = gl.load(s_ptrs + u * 8)
    wu = w
    su = s
    if GATED:
        wu = gl.load(w_ptrs + up_w + u * 128)
        su = gl.load(s_ptrs + up_s + u * 8)
    return w, s, wu, su


@gluon.jit
def _x_stage(x_smem, x_ptrs, j, X_UNITS: gl.constexpr, X_STAGES: gl.constexpr):
    """Copy stage ``j`` of x (units ``j X_UNITS`` on) into its slots of the ring, one commit
    group (``cp.async``; Triton 3.6 puts a CTA barrier before each unit's copy)."""
    for v in gl.static_range(X_UNITS):
        _cp_async(x_smem.index(j % X_STAGES * X_UNITS + v), x_ptrs + (j * X_UNITS + v) * 64)
    async_copy.commit_group()


@gluon.jit
def _x_unit(x_smem, u, X_UNITS: gl.constexpr, X_STAGES: gl.constexpr):
    """x's unit ``u`` in its stage's slots, [64, BLOCK_M]."""
    return x_smem.index(u % (X_UNITS * X_STAGES)).permute((1, 0))


@gluon.jit
def _unit_mma(w, s, wu, su, xt, acc, acc_up, BLOCK_N: gl.constexpr, a_layout: gl.constexpr,
              GATED: gl.constexpr):
    """A unit's wgmma of the gate (and up) rows by x's unit ``xt``, left in flight: at most the
    previous unit's still running after it."""
    acc = warpgroup_mma(_unit_tile(w, s, BLOCK_N, a_layout), xt, acc, is_async=True)
    if GATED:
        acc_up = warpgroup_mma(_unit_tile(wu, su, BLOCK_N, a_layout), xt, acc_up, is_async=True)
        acc, acc_up = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_up))
    else:
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    return acc, acc_up


@gluon.jit
def moe_gemm_mx_frag_gluon_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, top_k, alpha, limit, stride_am, stride_we, stride_om, stride_se, stride_be,
    GATED: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, K_UNITS: gl.constexpr,
    X_UNITS: gl.constexpr, X_STAGES: gl.constexpr, AHEAD: gl.constexpr, SPLIT: gl.constexpr,
    HAS_BIAS: gl.constexpr, CLAMPED: gl.constexpr, USE_PDL: gl.constexpr, num_warps: gl.constexpr,
):
    """``out^T = w . x^T`` for row blocks of ``BLOCK_M`` pairs of one expert (``w_ptr`` and
    ``ws_ptr`` int32 words, their strides in words). ``GATED`` takes gpt-oss's SwiGLU (clamped
    where ``CLAMPED``): each warp holds gate and up rows, two accumulators, or with ``SPLIT``
    the first half of the warps the tile's gate rows and the second its up rows (``BLOCK_N /
    2`` outputs a tile), paired through shared memory in the epilogue."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    NB: gl.constexpr = BLOCK_N // 16
    gl.static_assert(not SPLIT or (GATED and NB % 2 == 0))
    TWO: gl.constexpr = GATED and not SPLIT  # gate and up rows in each warp
    COLS: gl.constexpr = BLOCK_N // 2 if SPLIT else BLOCK_N  # outputs a tile
    n_tiles = gl.cdiv(n_out, COLS)
    pid = gl.program_id(0)
    pid_m = pid // n_tiles
    pid_n = pid % n_tiles
    if pid_m * BLOCK_M >= gl.load(total_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)

    # x: the block's rows, every unit, copied once (``X_STAGES`` 1), or through a ring of
    # ``X_STAGES`` stages of ``X_UNITS`` units (a multiple of the K loop's unroll), ``X_STAGES
    # - 2`` of them in flight: a stage's first unit waits for its copies, every thread's (a CTA
    # barrier), which also finds every warp past the previous stage's first unit and so its
    # wgmmas of the stage before retired: that stage's slots take the copy X_STAGES - 2 on
    STAGED: gl.constexpr = X_STAGES > 1
    gl.static_assert(not STAGED or (X_STAGES >= 3 and X_UNITS % (AHEAD + 1) == 0
                                    and K_UNITS % X_UNITS == 0))
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    x_smem = gl.allocate_shared_memory(
        gl.bfloat16, [X_STAGES * X_UNITS, BLOCK_M, 64],
        gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], gl.bfloat16))
    xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_layout))
    xk = gl.arange(0, 64, layout=gl.SliceLayout(0, x_layout))
    xpair = gl.load(sorted_ptr + pid_m * BLOCK_M + xm)
    xrow = gl.where(xpair < n_pairs, xpair, 0).to(gl.int64) // top_k
    x_ptrs = a_ptr + xrow[:, None] * stride_am + xk[None, :]
    for first in gl.static_range(X_STAGES - 2 if STAGED else 1):  # unrolled: Triton 3.9 then
        _x_stage(x_smem, x_ptrs, first, X_UNITS, X_STAGES)  # puts no barrier between copies

    # each thread's words: warp nb, lane (r, q), the word's (h, g) in its registers
    w_layout: gl.constexpr = gl.BlockedLayout([1, 1, 1, 4], [1, 8, 4, 1], [NB, 1, 1, 1],
                                              [3, 2, 1, 0])
    nb = gl.arange(0, NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, w_layout))))
    if SPLIT:  # warps of the second half: the up rows of the first half's blocks
        blk = pid_n * (NB // 2) + nb % (NB // 2)
        nb = gl.where(blk * 16 < n_out, blk, 0) + gl.where(nb >= NB // 2, n_out // 16, 0)
    else:
        nb = pid_n * NB + nb
        nb = gl.where(nb * 16 < n_out, nb, 0)  # a ragged last tile reads block 0; never stored
    r = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, w_layout))))
    q = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, w_layout))))
    hg = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, w_layout))))
    unit0 = nb[:, None, None, None].to(gl.int64) * K_UNITS
    w_ptrs = (w_ptr + expert * stride_we + unit0 * 128 + r[None, :, None, None] * 16
              + q[None, None, :, None] * 4 + hg[None, None, None, :])
    # a lane's four scales (one a word) are one 32-bit word: [NB, 8 (r), 4 (q)], the words'
    # layout less its (h, g)
    s_ptrs = (ws_ptr + expert * stride_se + nb[:, None, None].to(gl.int64) * (K_UNITS * 8)
              + r[None, :, None] + q[None, None, :] * 0)
    up_w = (n_out // 16) * K_UNITS * 128
    up_s = (n_out // 16) * K_UNITS * 8

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    acc = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, layout=mma)
    acc_up = acc
    if TWO:
        acc_up = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, layout=mma)
    # a ring of AHEAD units' loads in flight, the K loop unrolled by AHEAD + 1 so that no
    # register moves: each unit's step loads the unit AHEAD on, then multiplies the oldest
    RING: gl.constexpr = AHEAD + 1
    last: gl.constexpr = K_UNITS - 1
    ring = (_unit_loads(w_ptrs, s_ptrs, up_w, up_s, 0, TWO),)
    for i in gl.static_range(1, AHEAD):
        ring = ring + (_unit_loads(w_ptrs, s_ptrs, up_w, up_s, i if i < last else last, TWO),)
    if not STAGED:
        async_copy.wait_group(0)
        fence_async_shared()
        _cta_barrier()
    for u0 in range(0, K_UNITS - K_UNITS % RING, RING):
        if STAGED:
            if u0 % X_UNITS == 0:
                async_copy.wait_group(X_STAGES - 3)
                fence_async_shared()
                _cta_barrier()
                j = u0 // X_UNITS + X_STAGES - 2
                if j < K_UNITS // X_UNITS:
                    _x_stage(x_smem, x_ptrs, j, X_UNITS, X_STAGES)
                else:
                    async_copy.commit_group()  # empty: the stages after each stay its groups
        for i in gl.static_range(RING):
            ahead = _unit_loads(w_ptrs, s_ptrs, up_w, up_s, gl.minimum(u0 + i + AHEAD, last),
                                TWO)
            w, sc, wu, su = ring[0]
            acc, acc_up = _unit_mma(w, sc, wu, su, _x_unit(x_smem, u0 + i, X_UNITS, X_STAGES),
                                    acc, acc_up, BLOCK_N, a_layout, TWO)
            ring = ring[1:] + (ahead,)
    for i in gl.static_range(K_UNITS % RING):  # only where not staged
        w, sc, wu, su = ring[i]
        xt = _x_unit(x_smem, K_UNITS - K_UNITS % RING + i, X_UNITS, X_STAGES)
        acc, acc_up = _unit_mma(w, sc, wu, su, xt, acc, acc_up, BLOCK_N, a_layout, TWO)
    acc, acc_up = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_up))
    acc = acc * UNDER  # the values' 2 ** -64 (``moe_mxfp4.UNDER_SHIFT``)
    if SPLIT:  # gate rows above, up rows below: each to its output's thread
        e_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, num_warps], [0, 1])
        e_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_M],
                                           gl.SwizzledSharedLayout(1, 1, 1, [0, 1]), acc)
        _epilogue(e_smem.slice(0, COLS).load(e_layout), e_smem.slice(COLS, COLS).load(e_layout),
                  out_ptr, weights_ptr, sorted_ptr, bias_ptr, pid_m, pid_n, expert, n_pairs,
                  n_out, alpha, limit, stride_om, stride_be, GATED, BLOCK_M, COLS, HAS_BIAS,
                  CLAMPED, e_layout)
    else:
        _epilogue(acc, acc_up * UNDER, out_ptr, weights_ptr, sorted_ptr, bias_ptr, pid_m, pid_n,
                  expert, n_pairs, n_out, alpha, limit, stride_om, stride_be, GATED, BLOCK_M,
                  COLS, HAS_BIAS, CLAMPED, mma)


@gluon.jit
def _epilogue(acc, acc_up, out_ptr, weights_ptr, sorted_ptr, bias_ptr, pid_m, pid_n, expert,
              n_pairs, n_out, alpha, limit, stride_om, stride_be, GATED: gl.constexpr,
              BLOCK_M: gl.constexpr, COLS: gl.constexpr, HAS_BIAS: gl.constexpr,
              CLAMPED: gl.constexpr, layout: gl.constexpr):
    """Biases, the clamped SwiGLU (``GATED``: ``acc`` the gate's sums, ``acc_up`` the up's) or
    the routing weight, stored by pair id: outputs [COLS, BLOCK_M] in ``layout``."""
    offs_n = pid_n * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(1, layout))
    n_ok = offs_n < n_out
    offs_safe = gl.where(n_ok, offs_n, 0)
    pair = gl.load(sorted_ptr + pid_m * BLOCK_M
                   + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, layout)))
    valid = pair < n_pairs
    pair = gl.where(valid, pair, 0).to(gl.int64)
    dt: gl.constexpr = out_ptr.dtype.element_ty
    if HAS_BIAS:
        b_ptrs = bias_ptr + expert * stride_be + offs_safe
        acc += gl.load(b_ptrs).to(gl.float32)[:, None]
        if GATED:
            acc_up += gl.load(b_ptrs + n_out).to(gl.float32)[:, None]
    gate = acc.to(dt).to(gl.float32)
    if GATED:
        up = acc_up.to(dt).to(gl.float32)
        if CLAMPED:
            gate = gl.minimum(gate, limit)
            up = gl.minimum(gl.maximum(up, -limit), limit)
        res = ((up + 1.0) * (gate / (1.0 + gl.exp(-alpha * gate)))).to(dt)
    else:
        rw = gl.load(weights_ptr + pair, mask=valid, other=0.0).to(gl.float32)
        res = (gate * rw[None, :]).to(dt)
    gl.store(out_ptr + pair[None, :] * stride_om + offs_n[:, None], res,
             mask=valid[None, :] & n_ok[:, None])


def x_stages(k_units: int, block_m: int, block_k: int, num_stages: int,
             ahead: int = 2) -> tuple[int, int]:
    """x's stages (units a stage, stages) for a tile's ``block_k`` and ``num_stages``: a ring of
    ``num_stages`` (three or more) stages of ``block_k / 64`` units where that is a multiple of
    the K loop's unroll (``ahead + 1``) dividing K's units; else one stage of every unit, where
    it fits in shared memory."""
    units = block_k // 64
    if (num_stages >= 3 and units % (ahead + 1) == 0 and k_units % units == 0
            and units < k_units):
        return units, num_stages
    if k_units * block_m * 128 > 160 * 1024:
        raise ValueError(f"block_k {block_k} and num_stages {num_stages}: x's {k_units} units of "
                         f"{block_m} rows do not fit in shared memory at once, and are no ring")
    return k_units, 1


def launch_gluon(args: tuple, meta: dict, block_n: int, k_dim: int) -> None:
    """Launch for ``fused_moe._gemm``'s arguments (``w`` and its scales viewed as int32 words,
    their expert strides in words): ``block_n / 16`` warps, K in 64-deep units, x in the stages
    of ``x_stages`` for the tile's ``BLOCK_K`` and ``num_stages``, the words ``AHEAD`` units
    ahead, a gated tile's gate and up rows in separate warps where ``SPLIT``."""
    (a, w, out, weights, sorted_ids, expert_ids, total, ws, bias, n_pairs, n_out, _, top_k,
     n_blocks_m, alpha, limit, stride_am, _, _, stride_om, _, _, stride_be) = args
    w32 = w.reshape(w.shape[0], -1).view(torch.int32)
    s32 = ws.reshape(ws.shape[0], -1).view(torch.int32)
    ahead, split = meta["AHEAD"], meta["GATED"] and meta["SPLIT"]
    x_units, n_stages = x_stages(k_dim // 64, meta["BLOCK_M"], meta["BLOCK_K"],
                                 meta["num_stages"], ahead)
    grid = (n_blocks_m * -(-n_out // (block_n // 2 if split else block_n)),)
    moe_gemm_mx_frag_gluon_kernel[grid](
        a, w32, out, weights, sorted_ids, expert_ids, total, s32, bias, n_pairs, n_out, top_k,
        alpha, limit, stride_am, w32.stride(0), stride_om, s32.stride(0), stride_be,
        GATED=meta["GATED"], BLOCK_M=meta["BLOCK_M"], BLOCK_N=block_n, K_UNITS=k_dim // 64,
        X_UNITS=x_units, X_STAGES=n_stages, AHEAD=ahead, SPLIT=split, HAS_BIAS=meta["HAS_BIAS"],
        CLAMPED=meta["CLAMPED"], USE_PDL=meta["USE_PDL"], num_warps=block_n // 16,
        **{k: meta[k] for k in ("launch_pdl", "maxnreg") if meta.get(k)})
