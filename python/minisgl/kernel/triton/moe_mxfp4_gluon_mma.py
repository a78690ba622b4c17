"""The fragment layout's MXFP4 GEMM for row blocks of up to 8 pairs on mma.sync (Gluon), with
no shared memory and no CTA barrier: batch 1 and small batches.

A warp's 16 rows (and their up rows where gated) are one mma.sync m16n8k16 A operand a 16-deep
K slice, the same per-warp fragment as the wgmma kernel's (``moe_mxfp4_gluon``), so each thread
decodes its words where they land (``unit_tile``). The B operand, x's unit [64, 8], is loaded
by each thread straight from global memory in the operand's own layout: column n is the block's
pair n (the block's pairs repeated where it has fewer than 8), the same rows for every program
of the expert, so the loads hit L1 and L2. The words, scales and x come ``AHEAD`` units ahead.
Where the wgmma kernel needs a warpgroup (64 rows) a program and x in shared memory, a program
here is any number of warps, so one token's four experts spread over as many programs as 16-row
blocks.

A program's units form one chain: with ``AHEAD`` units in flight it takes about ``K_UNITS /
AHEAD`` memory latencies, and more units in registers cost more registers than the programs an
SM holds can spare. With ``STAGES`` (3 or more) the words and
scales go through a ring of ``STAGES`` slots in shared memory instead (``cp.async``, each thread
its own 16 and 4 bytes a unit, ``STAGES - 1`` units in flight), only x ``AHEAD`` units ahead
in registers.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from .moe_mxfp4 import UNDER
from .moe_mxfp4_gluon_unit import (
    block_pairs,
    epilogue,
    launch_args,
    row_block,
    slot_copy,
    slot_loads,
    unit_loads,
    unit_tile,
    word_pointers,
    word_slots,
    words_layout,
)


@gluon.jit
def _loads(w_ptrs, s_ptrs, x_ptrs, up_w, up_s, u, GATED: gl.constexpr):
    """Unit ``u``'s words and scales (gate rows, up rows) and x [64, 8]."""
    w, s, wu, su = unit_loads(w_ptrs, s_ptrs, up_w, up_s, u, GATED)
    return w, s, wu, su, gl.load(x_ptrs + u * 64)


@gluon.jit
def _step(ring, w_ptrs, s_ptrs, x_ptrs, up_w, up_s, u, acc, acc_up, AHEAD: gl.constexpr,
          K_UNITS: gl.constexpr, BLOCK_N: gl.constexpr, a_layout: gl.constexpr,
          GATED: gl.constexpr):
    """Unit ``u``: load the unit ``AHEAD`` on into the ring, multiply the oldest."""
    ahead = _loads(w_ptrs, s_ptrs, x_ptrs, up_w, up_s, gl.minimum(u + AHEAD, K_UNITS - 1), GATED)
    acc, acc_up = _mma(ring[0], acc, acc_up, BLOCK_N, a_layout, GATED)
    return ring[1:] + (ahead,), acc, acc_up


@gluon.jit
def _mma(loaded, acc, acc_up, BLOCK_N: gl.constexpr, a_layout: gl.constexpr,
         GATED: gl.constexpr):
    """A unit's mma.sync of its decoded gate (and up) rows by its x (``_loads``' tuple)."""
    w, s, wu, su, xb = loaded
    acc = mma_v2(unit_tile(w, s, BLOCK_N, a_layout), xb, acc)
    if GATED:
        acc_up = mma_v2(unit_tile(wu, su, BLOCK_N, a_layout), xb, acc_up)
    return acc, acc_up


@gluon.jit
def _slot_copy(slot, w_ptrs, s_ptrs, up_w, up_s, u, GATED: gl.constexpr):
    """Copy unit ``u``'s words and scales into a ring ``slot``, one commit group."""
    slot_copy(slot, w_ptrs, s_ptrs, up_w, up_s, u, GATED)
    async_copy.commit_group()


@gluon.jit
def _staged_step(slots, xs, w_ptrs, s_ptrs, x_ptrs, up_w, up_s, u, i: gl.constexpr, acc, acc_up,
                 STAGES: gl.constexpr, AHEAD: gl.constexpr, K_UNITS: gl.constexpr,
                 BLOCK_N: gl.constexpr, w_layout: gl.constexpr, a_layout: gl.constexpr,
                 GATED: gl.constexpr):
    """Unit ``u`` (in slot ``i``): copy the unit ``STAGES - 1`` on into the slot the unit before
    emptied, load x's unit ``AHEAD`` on, wait for this unit's copies and multiply it."""
    _slot_copy(slots[(i + STAGES - 1) % STAGES], w_ptrs, s_ptrs, up_w, up_s,
               gl.minimum(u + STAGES - 1, K_UNITS - 1), GATED)
    x_ahead = gl.load(x_ptrs + gl.minimum(u + AHEAD, K_UNITS - 1) * 64)
    async_copy.wait_group(STAGES - 1)
    w, s, wu, su = slot_loads(slots[i], w_layout, GATED)
    acc, acc_up = _mma((w, s, wu, su, xs[0]), acc, acc_up, BLOCK_N, a_layout, GATED)
    return xs[1:] + (x_ahead,), acc, acc_up


@gluon.jit
def moe_gemm_mx_frag_mma_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, top_k, alpha, limit, stride_am, stride_we, stride_om, stride_se, stride_be,
    GATED: gl.constexpr, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, K_UNITS: gl.constexpr,
    AHEAD: gl.constexpr, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, CLAMPED: gl.constexpr,
    USE_PDL: gl.constexpr, num_warps: gl.constexpr,
):
    """``out^T = w . x^T`` for row blocks of ``ROWS`` (at most 8) pairs of one expert, ``BLOCK_N``
    rows a program (a warp's 16; ``w_ptr`` and ``ws_ptr`` int32 words, their strides in words).
    ``GATED`` takes gpt-oss's SwiGLU (clamped where ``CLAMPED``), gate and up rows in each
    warp; ``STAGES`` (0: none) the words' ring of slots in shared memory. With no
    ``sorted_ptr`` and ``total_ptr`` (``ROWS`` 1) program row ``m`` is pair ``m`` and
    ``expert_ids_ptr`` the top-k ids, as the GEMVs take them: no alignment kernel."""
    NB: gl.constexpr = BLOCK_N // 16
    gl.static_assert(ROWS <= 8 and NB == num_warps)
    pid_m, pid_n = row_block(n_out, BLOCK_N, USE_PDL)
    if sorted_ptr is None:  # a pair a program, its expert its top-k id (no alignment)
        gl.static_assert(ROWS == 1)
    elif pid_m * ROWS >= gl.load(total_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, 8])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    # x: column n the block's pair n % ROWS (padding pairs read token 0; never stored)
    xn = gl.arange(0, 8, layout=gl.SliceLayout(0, b_layout))
    xpair = block_pairs(sorted_ptr, pid_m, ROWS, xn)
    xrow = gl.where(xpair < n_pairs, xpair, 0).to(gl.int64) // top_k
    xk = gl.arange(0, 64, layout=gl.SliceLayout(1, b_layout))
    x_ptrs = a_ptr + xrow[None, :] * stride_am + xk[:, None]

    w_layout: gl.constexpr = words_layout(NB)
    nb = gl.arange(0, NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, w_layout))))
    nb = pid_n * NB + nb
    nb = gl.where(nb * 16 < n_out, nb, 0)  # a ragged last tile reads block 0; never stored
    w_ptrs, s_ptrs, up_w, up_s = word_pointers(w_ptr, ws_ptr, expert, stride_we, stride_se, nb,
                                               n_out, K_UNITS, w_layout)

    acc = gl.zeros((BLOCK_N, 8), gl.float32, layout=mma)
    acc_up = acc
    if STAGES > 0:
        # the words' ring: STAGES - 1 units' copies in flight, the K loop unrolled by the ring
        # (static slots); x AHEAD units ahead in registers
        gl.static_assert(STAGES >= 3 and K_UNITS >= STAGES)
        slots = ()
        for i in gl.static_range(STAGES):
            slots = slots + (word_slots(NB, GATED),)
        for i in gl.static_range(STAGES - 1):
            _slot_copy(slots[i], w_ptrs, s_ptrs, up_w, up_s, i, GATED)
        xs = (gl.load(x_ptrs),)
        for i in gl.static_range(1, AHEAD):
            xs = xs + (gl.load(x_ptrs + gl.minimum(i, K_UNITS - 1) * 64),)
        for u0 in range(0, K_UNITS - K_UNITS % STAGES, STAGES):
            for i in gl.static_range(STAGES):
                xs, acc, acc_up = _staged_step(
                    slots, xs, w_ptrs, s_ptrs, x_ptrs, up_w, up_s, u0 + i, i, acc, acc_up,
                    STAGES, AHEAD, K_UNITS, BLOCK_N, w_layout, a_layout, GATED)
        async_copy.wait_group(0)  # the last units' copies were issued in the loop
        for i in gl.static_range(K_UNITS % STAGES):
            if i < AHEAD:
                xb = xs[i]
            else:
                xb = gl.load(x_ptrs + (K_UNITS - K_UNITS % STAGES + i) * 64)
            w, s, wu, su = slot_loads(slots[i], w_layout, GATED)
            acc, acc_up = _mma((w, s, wu, su, xb), acc, acc_up, BLOCK_N, a_layout, GATED)
    else:
        # a ring of AHEAD units' loads in flight, the K loop unrolled by AHEAD + 1
        RING: gl.constexpr = AHEAD + 1
        ring = (_loads(w_ptrs, s_ptrs, x_ptrs, up_w, up_s, 0, GATED),)
        for i in gl.static_range(1, AHEAD):
            ring = ring + (_loads(w_ptrs, s_ptrs, x_ptrs, up_w, up_s,
                                  gl.minimum(i, K_UNITS - 1), GATED),)
        for u0 in range(0, K_UNITS - K_UNITS % RING, RING):
            for i in gl.static_range(RING):
                ring, acc, acc_up = _step(ring, w_ptrs, s_ptrs, x_ptrs, up_w, up_s, u0 + i, acc,
                                          acc_up, AHEAD, K_UNITS, BLOCK_N, a_layout, GATED)
        for i in gl.static_range(K_UNITS % RING):
            acc, acc_up = _mma(ring[i], acc, acc_up, BLOCK_N, a_layout, GATED)
    epilogue(acc * UNDER, acc_up * UNDER, out_ptr, weights_ptr, sorted_ptr, bias_ptr, pid_m,
             pid_n, expert, n_pairs, n_out, alpha, limit, stride_om, stride_be, GATED, 8, ROWS,
             BLOCK_N, HAS_BIAS, CLAMPED, mma)


def launch_gluon_mma(args: tuple, meta: dict, block_n: int, k_dim: int) -> None:
    """Launch for ``fused_moe._gemm``'s arguments (``launch_args``): row blocks of ``BLOCK_M``
    (at most 8); where ``W_STAGED``, the words through a ring of ``num_stages`` slots."""
    n_blocks_m, n_out, run, common = launch_args(args, meta, block_n, k_dim)
    stages = meta["num_stages"] if meta.get("W_STAGED") else 0
    if stages and not 3 <= stages <= k_dim // 64:
        raise ValueError(f"the words' ring needs 3 to {k_dim // 64} slots, got {stages}")
    moe_gemm_mx_frag_mma_kernel[(n_blocks_m * -(-n_out // block_n),)](
        *run, ROWS=meta["BLOCK_M"], STAGES=stages, **common)
