"""The swapped MXFP4 GEMM over experts in the fragment layout (``quant.mxfp4_fragments``): each
thread loads the 16 bytes its wgmma A fragment holds (two rows, four words), decodes them where
they are (``mxfp4``'s word decoding, each word with its own scale), and the tile is the dot's
left operand as loaded; x is the right one in plain K order, straight from its shared-memory
stage. ``BLOCK_N`` rows are ``BLOCK_N / 16`` warps of 16 (``num_warps`` must match), a K step is
64 values. Otherwise ``moe_mxfp4.moe_gemm_mx_wide_kernel``'s work: the same arguments, rows,
epilogue and ``2 ** -64`` bookkeeping of the packed bf16 multiply (``FAST``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.kernel import aligned16
from minisgl.kernel.moe_types import FragmentScales, GluonFragmentScales, MoeActivation

from .moe_configs import tuned
from .moe_mxfp4 import UNDER, UNDER_SHIFT, expert_words
from .moe_mxfp4_frag_gemv import moe_gemv_mx_frag_kernel
from .moe_tiles import epilogue, tile, tile_rows
from .mxfp4 import DECODE_WORDS_BF16, bf16x2_pow2, e8m0, widen, word_pairs
from .pdl import wait_then_release


@triton.jit
def _frag_tile(words, s, dtype: tl.constexpr, BLOCK_N: tl.constexpr, FAST: tl.constexpr):
    """Words and their scales [NB, 8 (r), 4 (q), 4 (h, g)] -> the tile [BLOCK_N, 64] in
    ``dtype`` (``FAST``: times ``2 ** -64``): row 16 nb + 8 h + r, K 32 g + 16 j + 8 e + 2 q + p
    for the word's pair (j, e) and element p."""
    if FAST:
        mult = bf16x2_pow2(s.to(tl.int32) - 1 - UNDER_SHIFT)
        v = tl.inline_asm_elementwise(
            DECODE_WORDS_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, mult],
            dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        two126: tl.constexpr = 8.507059173023462e37
        scale = e8m0(s) * two126
        p0, p1, p2, p3 = word_pairs(words)
        v0, v1 = widen(p0)
        v2, v3 = widen(p1)
        v4, v5 = widen(p2)
        v6, v7 = widen(p3)
        v = ((v0 * scale).to(dtype), (v1 * scale).to(dtype), (v2 * scale).to(dtype),
             (v3 * scale).to(dtype), (v4 * scale).to(dtype), (v5 * scale).to(dtype),
             (v6 * scale).to(dtype), (v7 * scale).to(dtype))
    e0 = tl.join(tl.join(v[0], v[1]), tl.join(v[2], v[3]))  # [..., p, e] of j = 0
    e1 = tl.join(tl.join(v[4], v[5]), tl.join(v[6], v[7]))
    t = tl.join(e0, e1)  # [NB, r, q, hg, p, e, j]
    NB: tl.constexpr = BLOCK_N // 16
    t = tl.reshape(t, (NB, 8, 4, 2, 2, 2, 2, 2))  # [nb, r, q, h, g, p, e, j]
    t = tl.permute(t, (0, 3, 1, 4, 7, 6, 2, 5))  # [nb, h, r, g, j, e, q, p]
    return tl.reshape(t, (BLOCK_N, 64))


@triton.jit
def moe_gemm_mx_frag_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, k_dim, top_k, n_blocks_m, alpha, limit,
    stride_am, stride_we, stride_wn, stride_om, stride_se, stride_sn, stride_be,
    GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
    PRECISION: tl.constexpr, FAST: tl.constexpr, HAS_BIAS: tl.constexpr,
    CLAMPED: tl.constexpr, GELU: tl.constexpr = False, USE_PDL: tl.constexpr = False,
):
    """``out^T = w . x^T`` over the fragment layout (``n_out`` a multiple of 16, ``k_dim`` of
    64; the strides in bytes, as the word-layout kernels take them)."""
    wait_then_release(USE_PDL)
    pid_m, pid_n = tile(tl.cdiv(n_out, BLOCK_N), n_blocks_m, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    pair, valid, row, expert, offs_n, n_ok, offs_n_safe = tile_rows(
        sorted_ptr, expert_ids_ptr, pid_m, pid_n, n_pairs, top_k, n_out, BLOCK_M, BLOCK_N)
    NB: tl.constexpr = BLOCK_N // 16
    steps = k_dim // 64
    nb = pid_n * NB + tl.arange(0, NB)
    nb = tl.where(nb * 16 < n_out, nb, 0)  # a ragged last tile reads block 0; never stored
    lane = (tl.arange(0, 8) * 16)[None, :, None, None] + (tl.arange(0, 4) * 4)[None, None, :, None]
    hg = tl.arange(0, 4)[None, None, None, :]
    w_ptrs = expert_words(w_ptr, expert, stride_we) + nb[:, None, None, None] * (steps * 128) \
        + lane + hg
    # each word's scale: [nb, r, 4 (h, g)] bytes, the same for the lane's four q
    s_ptrs = ws_ptr + expert * stride_se + nb[:, None, None, None] * (steps * 32) \
        + (tl.arange(0, 8) * 4)[None, :, None, None] + 0 * lane + hg
    up_w, up_s = (n_out // 16) * steps * 128, (n_out // 16) * steps * 32
    a_ptrs = a_ptr + row[None, :] * stride_am + tl.arange(0, 64)[:, None]
    dt = a_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(steps):
        a = tl.load(a_ptrs, mask=valid[None, :], other=0.0)  # padding rows' x is not read
        w = _frag_tile(tl.load(w_ptrs + k * 128), tl.load(s_ptrs + k * 32), dt, BLOCK_N, FAST)
        acc = tl.dot(w, a, acc, input_precision=PRECISION)
        if GATED:
            w = _frag_tile(tl.load(w_ptrs + up_w + k * 128), tl.load(s_ptrs + up_s + k * 32),
                           dt, BLOCK_N, FAST)
            acc_up = tl.dot(w, a, acc_up, input_precision=PRECISION)
        a_ptrs += 64
    if FAST:
        acc *= UNDER
        acc_up *= UNDER
    epilogue(tl.trans(acc), tl.trans(acc_up), out_ptr, weights_ptr, bias_ptr, pair, valid, expert,
             offs_n, n_ok, offs_n_safe, n_out, stride_om, stride_be, alpha, limit, GATED,
             HAS_BIAS, CLAMPED, GELU)


# (rows an expert at most, ``MoeConfig``'s fields): the H200's best tiles at gpt-oss-20b's shapes
# (``benchmark/kernels/bench_moe_fragments.py``: 1 | 4 | 16, 64 | 128 | 256 | 512, 1,024 | 4,096
# tokens; row blocks of one take the GEMV, ``block_k`` its step). From 64 rows two stages: with
# three the 64-row, 8-warp tiles raced on the H200 (a few wrong outputs a call, never with two)
FRAG_TILES = ((0.25, (1, 16, 16, 256, 1, 2, 2, None, None)),
              (1.0, (1, 16, 16, 128, 1, 1, 2, None, None)),
              (8.0, (16, 128, 128, 64, 1, 8, 4, True, None)),
              (16.0, (16, 64, 64, 64, 1, 4, 4, True, None)),
              (32.0, (32, 128, 128, 64, 4, 8, 4, True, 80)),
              (128.0, (32, 64, 64, 64, 4, 4, 4, True, None)),
              (float("inf"), (64, 64, 64, 64, 4, 4, 2, True, None)))
# with ``GluonFragmentScales``: up to 4 rows an expert, row blocks of 8 on the Gluon kernel
# (``moe_mxfp4_gluon``; ``block_n`` 64, 4 warps), faster there; from 8 rows the 92 KB of x a
# 16-row block copies whole leave two programs an SM, and the Triton tiles win
# (docs/performance.md, "A Gluon kernel for the small row blocks")
GLUON_TILES = (FRAG_TILES[:2] + ((4.0, (8, 64, 64, 64, 1, 4, 1, True, None, True)),)
               + FRAG_TILES[2:])


def frag_tile(rows: float, gluon: bool = False, key: tuple[int, int] | None = None,
              device: torch.device | None = None) -> tuple:
    """The fragment layout's ``MoeConfig`` fields for ``rows`` routed rows an expert: this GPU's
    tuned table for the experts' ``key`` (2I, H) where ``moe_configs`` has one
    (``tune_moe.py --mxfp4 --layout fragments|gluon``), else the built-in one."""
    if key is not None and device is not None:
        fields = tuned(rows, "mxfp4_gluon" if gluon else "mxfp4_fragments", *key, device)
        if fields is not None:
            return fields
    return next(tile for most, tile in (GLUON_TILES if gluon else FRAG_TILES) if rows <= most)


def takes_gluon(scales: FragmentScales, x: torch.Tensor, fast: bool, act: MoeActivation) -> bool:
    """Whether the tiles marked ``gluon`` may take the Gluon kernel: ``GluonFragmentScales``,
    the PTX decoding (``fast``: bf16 on Hopper), gpt-oss's clamped SwiGLU and x's rows 16-byte
    aligned (its ``cp.async``); else the Triton kernels' tiles."""
    return (isinstance(scales, GluonFragmentScales) and fast and act.kind == "swiglu_clamped"
            and aligned16(x) and x.stride(0) % 8 == 0)


def launch_frag(grid, args: tuple, meta: dict, gemv: bool, block_n: int, block_k: int,
                k_dim: int, fast: bool, gluon: bool = False) -> None:
    """Launch the GEMV (row blocks of one, ``block_k / 64`` units a K step) or the GEMM
    (``block_n / 16`` warps of 16 rows, K steps of 64; with ``gluon``, on ``moe_mxfp4_gluon``,
    on ``moe_mxfp4_gluon_mma`` where ``meta["MMA"]``, on ``moe_mxfp4_gluon_ws`` where
    ``meta["WS"]``) with ``fused_moe._gemm``'s arguments
    and compile-time options."""
    meta = dict(meta)
    if gluon and meta["HALVES"] and (meta["MMA"] or meta["WS"] or gemv):
        raise ValueError("gluon_halves splits the wgmma tile's units: not with gluon_mma, "
                         "gluon_ws or one-row blocks")
    if gluon and meta["MMA"]:
        from .moe_mxfp4_gluon_mma import launch_gluon_mma  # Gluon: Triton 3.6 and later

        launch_gluon_mma(args, meta, block_n, k_dim)
    elif gluon and meta["WS"]:
        from .moe_mxfp4_gluon_ws import launch_gluon_ws

        launch_gluon_ws(args, meta, block_n, k_dim)
    elif gluon and not gemv:
        from .moe_mxfp4_gluon import launch_gluon  # Gluon: Triton 3.6 and later

        launch_gluon(args, meta, block_n, k_dim)
    elif gemv:
        units = max(1, block_k // 64)
        for name in ("BLOCK_M", "GROUP_M", "PRECISION", "BLOCK_K"):
            del meta[name]
        meta["EVEN_K"] = (k_dim // 64) % units == 0
        moe_gemv_mx_frag_kernel[grid](*args, UNITS=units, **meta)
    else:
        for name in ("BLOCK_K", "EVEN_K"):
            del meta[name]
        meta["num_warps"] = block_n // 16
        moe_gemm_mx_frag_kernel[grid](*args, FAST=fast, **meta)
