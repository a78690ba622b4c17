"""The parts of the Gluon MXFP4 GEMMs over the fragment layout (``moe_mxfp4_gluon`` on wgmma,
``moe_mxfp4_gluon_mma`` on mma.sync): a thread's words and scales of a 64-deep K unit loaded
into its registers and decoded as the A operand (one warp's fragment is the same for both), the
wgmma by x's unit in shared memory left in flight, x's stages copied into their ring's slots,
the epilogue, and the arguments both launchers pass."""

from __future__ import annotations

import torch
import triton.language as tl
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
def decoded_words(words, byte):
    """Words [..., W] and their scale bytes (e8m0) [..., W] -> the values times 2 ** -64 in bf16
    [..., W, 2 (p), 2 (j0), 2 (j1)]: value 4 j1 + 2 j0 + p of each word (``DECODE_WORDS_BF16``)."""
    mult = (byte + (126 - UNDER_SHIFT)) * 0x00800080  # the bf16 pair (2 ** e, 2 ** e)
    v = gl.inline_asm_elementwise(DECODE_WORDS_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r",
                                  [words, mult], dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    # a join's new dimension is the last: value 4 j1 + 2 j0 + p of pair (j1, j0) -> [.., p, j0, j1]
    return gl.join(gl.join(gl.join(v[0], v[1]), gl.join(v[2], v[3])),
                   gl.join(gl.join(v[4], v[5]), gl.join(v[6], v[7])))


@gluon.jit
def unit_tile(words, s, BLOCK_N: gl.constexpr, a_layout: gl.constexpr):
    """A unit's words and scales [NB, 8 (r), 4 (q), 4 (h, g)] -> the wgmma A operand
    [BLOCK_N, 64] (times 2 ** -64), in its register layout as decoded."""
    NB: gl.constexpr = BLOCK_N // 16
    hg = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(
        2, words.type.layout))))
    t = decoded_words(words, (s[:, :, :, None] >> (8 * hg[None, None, None, :])) & 0xFF)
    t = gl.reshape(t, (NB, 8, 4, 2, 2, 2, 2, 2))  # [nb, r, q, h, g, p, j0, j1]
    # row 16 nb + 8 h + r, K 32 g + 16 j1 + 8 j0 + 2 q + p
    t = gl.permute(t, (0, 3, 1, 4, 7, 6, 2, 5))
    return gl.convert_layout(gl.reshape(t, (BLOCK_N, 64)), a_layout, assert_trivial=True)


@gluon.jit
def half_tile(words, s, G: gl.constexpr, BLOCK_N: gl.constexpr, a_layout: gl.constexpr):
    """Half ``G`` of a unit (K ``32 G`` to ``32 G + 31``: each row's words of group ``g = G``)
    -> the wgmma A operand [BLOCK_N, 32] (times 2 ** -64), in its register layout as decoded:
    ``unit_tile``'s decode, a 32-deep wgmma's worth at a time."""
    NB: gl.constexpr = BLOCK_N // 16
    w0, w1 = gl.split(gl.reshape(words, (NB, 8, 4, 2, 2)))  # [.., (h, g)] -> g's [.., h]
    w = w1 if G else w0
    h = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(
        2, w.type.layout))))
    s = gl.convert_layout(s, gl.SliceLayout(3, w.type.layout), assert_trivial=True)
    t = decoded_words(w, (s[:, :, :, None] >> (8 * (2 * h[None, None, None, :] + G))) & 0xFF)
    # [nb, r, q, h, p, j0, j1]: row 16 nb + 8 h + r, K (within the half) 16 j1 + 8 j0 + 2 q + p
    t = gl.permute(t, (0, 3, 1, 6, 5, 2, 4))
    return gl.convert_layout(gl.reshape(t, (BLOCK_N, 32)), a_layout, assert_trivial=True)


@gluon.jit
def row_block(n_out, COLS: gl.constexpr, USE_PDL: gl.constexpr):
    """This program's (row block, tile of ``COLS`` outputs), after the kernel before (PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    n_tiles = gl.cdiv(n_out, COLS)
    pid = gl.program_id(0)
    return pid // n_tiles, pid % n_tiles


@gluon.jit
def block_pairs(sorted_ptr, pid_m, ROWS: gl.constexpr, idx):
    """The pair ids at ``idx % ROWS`` of row block ``pid_m``: the aligned pairs', or where
    ``sorted_ptr`` is None (one pair a block, in pair order: no alignment) ``pid_m``."""
    if sorted_ptr is None:
        return pid_m + idx * 0
    else:
        return gl.load(sorted_ptr + pid_m * ROWS + idx % ROWS)


@gluon.jit
def x_rows(a_ptr, sorted_ptr, pid_m, n_pairs, top_k, stride_am, BLOCK_M: gl.constexpr,
           x_layout: gl.constexpr):
    """Pointers to the first 64 columns of row block ``pid_m``'s rows of x (each pair's token),
    in ``x_layout``, and the rows that are pairs: a padding row's x is not read (its copies
    masked, zeros; its outputs are not stored)."""
    xm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x_layout))
    xk = gl.arange(0, 64, layout=gl.SliceLayout(0, x_layout))
    xpair = gl.load(sorted_ptr + pid_m * BLOCK_M + xm)
    x_ok = xpair < n_pairs
    xrow = gl.where(x_ok, xpair, 0).to(gl.int64) // top_k
    return a_ptr + xrow[:, None] * stride_am + xk[None, :], x_ok[:, None]


@gluon.constexpr_function
def words_layout(NB):
    """Each thread's words of a unit: warp nb, lane (r, q), the word's (h, g) in its registers:
    [NB, 8 (r), 4 (q), 4 (h, g)]."""
    return gl.BlockedLayout([1, 1, 1, 4], [1, 8, 4, 1], [NB, 1, 1, 1], [3, 2, 1, 0])


@gluon.jit
def word_pointers(w_ptr, ws_ptr, expert, stride_we, stride_se, nb, n_out,
                  K_UNITS: gl.constexpr, layout: gl.constexpr):
    """Unit 0's words [NB, 8, 4, 4] and scale words [NB, 8, 4] of the 16-row blocks ``nb`` of
    ``expert`` (``layout``: ``words_layout``), and the offsets of their up rows (in words)."""
    r = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, layout))))
    q = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, layout))))
    hg = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, layout))))
    unit0 = nb[:, None, None, None].to(gl.int64) * K_UNITS
    w_ptrs = (w_ptr + expert * stride_we + unit0 * 128 + r[None, :, None, None] * 16
              + q[None, None, :, None] * 4 + hg[None, None, None, :])
    # a lane's four scales (one a word) are one 32-bit word: the words' layout less its (h, g)
    s_ptrs = (ws_ptr + expert * stride_se + nb[:, None, None].to(gl.int64) * (K_UNITS * 8)
              + r[None, :, None] + q[None, None, :] * 0)
    return w_ptrs, s_ptrs, (n_out // 16) * K_UNITS * 128, (n_out // 16) * K_UNITS * 8


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
def x_stage(x_smem, x_ptrs, x_ok, j, slot: gl.constexpr, X_UNITS: gl.constexpr, w_smem, w_ptrs,
            s_ptrs, up_w, up_s, W_STAGED: gl.constexpr, GATED: gl.constexpr):
    """Copy stage ``j`` of x (units ``j X_UNITS`` on; the rows where ``x_ok``, zeros in the
    others) into the ring's ``slot``, one commit group (``cp.async``; each unit an allocation
    of its own, so that Triton's barrier analysis puts no CTA barrier between the copies nor
    between them and the other slots' wgmmas); with ``W_STAGED``, the units' words and scales
    too, into ``w_smem`` (``word_slots``), each thread its own (``GATED``: the up rows' as
    well)."""
    for v in gl.static_range(X_UNITS):
        cp_async(x_smem[slot * X_UNITS + v], x_ptrs + (j * X_UNITS + v) * 64, mask=x_ok)
        if W_STAGED:
            slot_copy(w_smem[slot * X_UNITS + v], w_ptrs, s_ptrs, up_w, up_s, j * X_UNITS + v,
                      GATED)
    async_copy.commit_group()


@gluon.jit
def word_slots(NB: gl.constexpr, GATED: gl.constexpr):
    """One ring slot's shared memory for a unit's words [NB, 8, 4, 4] and scale words
    [NB, 8, 4] (and the up rows' where ``GATED``): each thread copies its own 16 and 4 bytes
    there and reads them back (``slot_loads``), so no other thread's copy is waited for."""
    w_shared: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0])
    s_shared: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    slot = (gl.allocate_shared_memory(gl.int32, [NB, 8, 4, 4], w_shared),
            gl.allocate_shared_memory(gl.int32, [NB, 8, 4], s_shared))
    if GATED:
        slot = slot + (gl.allocate_shared_memory(gl.int32, [NB, 8, 4, 4], w_shared),
                       gl.allocate_shared_memory(gl.int32, [NB, 8, 4], s_shared))
    return slot


@gluon.jit
def slot_copy(w_slot, w_ptrs, s_ptrs, up_w, up_s, u, GATED: gl.constexpr):
    """Copy unit ``u``'s words and scale words (gate rows, up rows) into a ring slot
    (``word_slots``; ``cp.async``, the caller commits the group)."""
    cp_async(w_slot[0], w_ptrs + u * 128)
    cp_async(w_slot[1], s_ptrs + u * 8)
    if GATED:
        cp_async(w_slot[2], w_ptrs + up_w + u * 128)
        cp_async(w_slot[3], s_ptrs + up_s + u * 8)


@gluon.jit
def slot_loads(w_slot, layout: gl.constexpr, GATED: gl.constexpr):
    """A slot's words and scale words in ``words_layout`` (``unit_loads``' from a ring slot)."""
    w = w_slot[0].load(layout)
    s = w_slot[1].load(gl.SliceLayout(3, layout))
    wu = w
    su = s
    if GATED:
        wu = w_slot[2].load(layout)
        su = w_slot[3].load(gl.SliceLayout(3, layout))
    return w, s, wu, su


@gluon.jit
def unit_step(ring, w_ptrs, s_ptrs, up_w, up_s, u, xt, acc, acc_up, AHEAD: gl.constexpr,
              K_UNITS: gl.constexpr, BLOCK_N: gl.constexpr, a_layout: gl.constexpr,
              TWO: gl.constexpr, HALVES: gl.constexpr = False):
    """Unit ``u``: load the unit ``AHEAD`` on into the ring, multiply the oldest by x's unit
    ``xt`` ([64, BLOCK_M] in shared memory)."""
    ahead = unit_loads(w_ptrs, s_ptrs, up_w, up_s, gl.minimum(u + AHEAD, K_UNITS - 1), TWO)
    w, sc, wu, su = ring[0]
    acc, acc_up = unit_mma(w, sc, wu, su, xt, acc, acc_up, BLOCK_N, a_layout, TWO, HALVES)
    return ring[1:] + (ahead,), acc, acc_up


@gluon.jit
def unit_mma(w, s, wu, su, xt, acc, acc_up, BLOCK_N: gl.constexpr, a_layout: gl.constexpr,
             GATED: gl.constexpr, HALVES: gl.constexpr = False):
    """A unit's wgmma of the gate (and up) rows by x's unit ``xt``, left in flight: at most the
    previous unit's still running after it. ``HALVES``: two wgmmas 32 deep (``half_tile``),
    each half decoded while the one before runs (half the A registers live)."""
    for g in gl.static_range(2 if HALVES else 1):
        xg = xt.slice(32 * g, 32) if HALVES else xt
        acc = warpgroup_mma(a_tile(w, s, g if HALVES else -1, BLOCK_N, a_layout), xg, acc,
                            is_async=True)
        if GATED:
            acc_up = warpgroup_mma(a_tile(wu, su, g if HALVES else -1, BLOCK_N, a_layout), xg,
                                   acc_up, is_async=True)
            acc, acc_up = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_up))
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
    return acc, acc_up


@gluon.jit
def a_tile(words, s, G: gl.constexpr, BLOCK_N: gl.constexpr, a_layout: gl.constexpr):
    """The A operand of a unit's words: all of it (``G`` -1, ``unit_tile``) or half ``G``."""
    if G < 0:
        return unit_tile(words, s, BLOCK_N, a_layout)
    else:
        return half_tile(words, s, G, BLOCK_N, a_layout)


@gluon.jit
def epilogue(acc, acc_up, out_ptr, weights_ptr, sorted_ptr, bias_ptr, pid_m, pid_n, expert,
             n_pairs, n_out, alpha, limit, stride_om, stride_be, GATED: gl.constexpr,
             BLOCK_M: gl.constexpr, ROWS: gl.constexpr, COLS: gl.constexpr,
             HAS_BIAS: gl.constexpr, CLAMPED: gl.constexpr, layout: gl.constexpr):
    """Biases, the clamped SwiGLU (``GATED``: ``acc`` the gate's sums, ``acc_up`` the up's) or
    the routing weight, stored by pair id: outputs [COLS, BLOCK_M] in ``layout``, of which the
    first ``ROWS`` columns are the row block's pairs."""
    offs_n = pid_n * COLS + gl.arange(0, COLS, layout=gl.SliceLayout(1, layout))
    n_ok = offs_n < n_out
    offs_safe = gl.where(n_ok, offs_n, 0)
    col = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, layout))
    pair = block_pairs(sorted_ptr, pid_m, ROWS, col)
    valid = (pair < n_pairs) & (col < ROWS)
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


def launch_args(args: tuple, meta: dict, block_n: int, k_dim: int) -> tuple:
    """(row blocks, outputs, the kernels' run-time arguments, their common compile-time ones)
    from ``fused_moe._gemm``'s: ``w`` and its scales viewed as int32 words, their expert
    strides in words; ``block_n / 16`` warps, K in 64-deep units, the words ``AHEAD`` ahead."""
    (a, w, out, weights, sorted_ids, expert_ids, total, ws, bias, n_pairs, n_out, _, top_k,
     n_blocks_m, alpha, limit, stride_am, _, _, stride_om, _, _, stride_be) = args
    w32 = w.reshape(w.shape[0], -1).view(torch.int32)
    s32 = ws.reshape(ws.shape[0], -1).view(torch.int32)
    run = (a, w32, out, weights, sorted_ids, expert_ids, total, s32, bias, n_pairs, n_out, top_k,
           alpha, limit, stride_am, w32.stride(0), stride_om, s32.stride(0), stride_be)
    common = dict(GATED=meta["GATED"], BLOCK_N=block_n, K_UNITS=k_dim // 64, AHEAD=meta["AHEAD"],
                  HAS_BIAS=meta["HAS_BIAS"], CLAMPED=meta["CLAMPED"], USE_PDL=meta["USE_PDL"],
                  num_warps=block_n // 16,
                  **{k: meta[k] for k in ("launch_pdl", "maxnreg") if meta.get(k)})
    return n_blocks_m, n_out, run, common
