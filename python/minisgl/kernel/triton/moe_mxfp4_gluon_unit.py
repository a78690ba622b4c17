"""One 64-deep K unit of the Gluon MXFP4 GEMM (``moe_mxfp4_gluon``): a thread's words and
scales loaded into its registers, decoded as the wgmma A operand, the wgmma by x's unit in
shared memory left in flight; x's stages copied into their ring's slots."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from .moe_mxfp4 import UNDER_SHIFT
from .mxfp4 import DECODE_WORDS_BF16

# Triton 3.6 names the cp.async copy async_copy_global_to_shared and the CTA barrier
# thread_barrier, later versions async_load and barrier
cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def unit_tile(words, s, BLOCK_N: gl.constexpr, a_layout: gl.constexpr):
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
def unit_loads(w_ptrs, s_ptrs, up_w, up_s, u, GATED: gl.constexpr):
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
def x_stage(x_smem, x_ptrs, j, slot: gl.constexpr, X_UNITS: gl.constexpr):
    """Copy stage ``j`` of x (units ``j X_UNITS`` on) into the ring's ``slot``, one commit
    group (``cp.async``; each unit an allocation of its own, so that Triton's barrier analysis
    puts no CTA barrier between the copies nor between them and the other slots' wgmmas)."""
    for v in gl.static_range(X_UNITS):
        cp_async(x_smem[slot * X_UNITS + v], x_ptrs + (j * X_UNITS + v) * 64)
    async_copy.commit_group()


@gluon.jit
def unit_step(ring, w_ptrs, s_ptrs, up_w, up_s, u, xt, acc, acc_up, AHEAD: gl.constexpr,
               K_UNITS: gl.constexpr, BLOCK_N: gl.constexpr, a_layout: gl.constexpr,
               TWO: gl.constexpr):
    """Unit ``u``: load the unit ``AHEAD`` on into the ring, multiply the oldest by x's unit
    ``xt`` ([64, BLOCK_M] in shared memory)."""
    ahead = unit_loads(w_ptrs, s_ptrs, up_w, up_s, gl.minimum(u + AHEAD, K_UNITS - 1), TWO)
    w, sc, wu, su = ring[0]
    acc, acc_up = unit_mma(w, sc, wu, su, xt, acc, acc_up, BLOCK_N, a_layout, TWO)
    return ring[1:] + (ahead,), acc, acc_up


@gluon.jit
def unit_mma(w, s, wu, su, xt, acc, acc_up, BLOCK_N: gl.constexpr, a_layout: gl.constexpr,
              GATED: gl.constexpr):
    """A unit's wgmma of the gate (and up) rows by x's unit ``xt``, left in flight: at most the
    previous unit's still running after it."""
    acc = warpgroup_mma(unit_tile(w, s, BLOCK_N, a_layout), xt, acc, is_async=True)
    if GATED:
        acc_up = warpgroup_mma(unit_tile(wu, su, BLOCK_N, a_layout), xt, acc_up, is_async=True)
        acc, acc_up = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_up))
    else:
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    return acc, acc_up
