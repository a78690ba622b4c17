"""The fragment layout's Gluon GEMM with its warps specialized: ``moe_mxfp4_gluon``'s staged tile
(the words travel with x through a ring of one-unit slots) with no CTA barrier at all.

There, every thread copies its share of each unit and one CTA barrier a unit makes x's copies
visible to both warpgroups' wgmmas, so all eight warps step through K together. Here a copy
warpgroup fills the ring (``cp.async``, each thread's completion an arrival on the slot's
``full`` mbarrier) and two warpgroups consume it, each waiting only for its slot and releasing
it (the slot's ``empty`` mbarrier) once its wgmma of that unit has retired: the consumers never
wait for each other or for the copies of later units, and issue no copies themselves. A tile
is 128 weight rows: GEMM 1's 64 gate rows in the first warpgroup and their up rows in the
second (the up sums passed to the first through shared memory for the SwiGLU), or GEMM 2's two
halves of 64 outputs, each stored by its own warpgroup. The decode, the wgmma and the epilogue
are ``moe_mxfp4_gluon_unit``'s.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma_wait,
)

from .moe_mxfp4 import UNDER
from .moe_mxfp4_gluon_unit import (
    cp_async,
    epilogue,
    launch_args,
    row_block,
    unit_mma,
    word_pointers,
    words_layout,
    x_rows,
)

# registers a thread of the copy warpgroup and of the second MMA warpgroup, and the cap on a
# thread's registers the launch sets where the tile sets none (two programs an SM)
COPY_REGS, MMA_REGS = gl.constexpr(40), gl.constexpr(96)
MAXNREG = 80


@gluon.jit
def moe_gemm_mx_frag_ws_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, top_k, alpha, limit, stride_am, stride_we, stride_om, stride_se, stride_be,
    GATED: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, K_UNITS: gl.constexpr,
    SLOTS: gl.constexpr, AHEAD: gl.constexpr, HAS_BIAS: gl.constexpr, CLAMPED: gl.constexpr,
    USE_PDL: gl.constexpr, num_warps: gl.constexpr,
):
    """``out^T = w . x^T`` for row blocks of ``BLOCK_M`` pairs of one expert and 128 weight
    rows (``BLOCK_N``), through a ring of ``SLOTS`` units; the launch's ``num_warps`` (4) are
    the first MMA warpgroup, the second and the copy warpgroup come with ``warp_specialize``.
    ``AHEAD`` is unused (the launcher's common arguments)."""
    gl.static_assert(BLOCK_N == 128 and num_warps == 4)
    COLS: gl.constexpr = 64 if GATED else 128  # outputs a tile
    pid_m, pid_n = row_block(n_out, COLS, USE_PDL)
    if pid_m * BLOCK_M >= gl.load(total_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)

    x_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], gl.bfloat16)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [SLOTS, BLOCK_M, 64], x_shared)
    # each ring a leading slot dimension over one slot's layout
    w_ring = gl.allocate_shared_memory(gl.int32, [SLOTS, 8, 8, 4, 4],
                                       gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))
    s_ring = gl.allocate_shared_memory(gl.int32, [SLOTS, 8, 8, 4],
                                       gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    sums = gl.allocate_shared_memory(gl.float32, [64, BLOCK_M],
                                     gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    full = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(SLOTS):
        mbarrier.init(full.index(s), count=128)  # each copying thread's cp.async completion
        mbarrier.init(empty.index(s), count=2)  # each MMA warpgroup, its wgmma retired
    mbarrier.init(done.index(0), count=1)
    # the partitions' arguments: run-time values and shared memory in tuples, the constexprs
    # written out in each call (a constexpr passed through a tuple variable becomes a tensor)
    p = (a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, ws_ptr, bias_ptr, expert, pid_m, pid_n,
         n_pairs, n_out, top_k, alpha, limit, stride_am, stride_we, stride_om, stride_se,
         stride_be)
    smem = (x_ring, w_ring, s_ring, sums, full, empty, done)
    gl.warp_specialize([
        (_mma, (p, smem, 0, GATED, BLOCK_M, K_UNITS, SLOTS, HAS_BIAS, CLAMPED)),
        (_mma, (p, smem, 1, GATED, BLOCK_M, K_UNITS, SLOTS, HAS_BIAS, CLAMPED)),
        (_copies, (p, smem, 0, GATED, BLOCK_M, K_UNITS, SLOTS, HAS_BIAS, CLAMPED)),
    ], [4, 4], [MMA_REGS, COPY_REGS])


@gluon.jit
def _mma(p, smem, HALF: gl.constexpr, GATED: gl.constexpr, BLOCK_M: gl.constexpr,
         K_UNITS: gl.constexpr, SLOTS: gl.constexpr, HAS_BIAS: gl.constexpr,
         CLAMPED: gl.constexpr):
    """An MMA warpgroup: the tile's rows ``64 HALF`` on. GEMM 1's up rows (``HALF`` 1) hand
    their sums to the gate rows' warpgroup (``sums``, then ``done``), which stores the SwiGLU
    of both; GEMM 2's halves each store their own 64 outputs."""
    (a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, ws_ptr, bias_ptr, expert, pid_m, pid_n,
     n_pairs, n_out, top_k, alpha, limit, stride_am, stride_we, stride_om, stride_se,
     stride_be) = p
    x_ring, w_ring, s_ring, sums, full, empty, done = smem
    mma: gl.constexpr = _mma_layout(BLOCK_M)
    acc = _mma_loop(x_ring, w_ring, s_ring, full, empty, HALF, BLOCK_M, K_UNITS, SLOTS)
    if GATED and HALF == 1:
        sums.store(acc)
        mbarrier.arrive(done.index(0), count=1)
    else:
        up = acc
        if GATED:
            mbarrier.wait(done.index(0), 0)
            up = sums.load(mma)
        epilogue(acc, up, out_ptr, weights_ptr, sorted_ptr, bias_ptr, pid_m,
                 pid_n if GATED else 2 * pid_n + HALF, expert, n_pairs, n_out, alpha, limit,
                 stride_om, stride_be, GATED, BLOCK_M, BLOCK_M, 64, HAS_BIAS, CLAMPED, mma)


@gluon.jit
def _mma_loop(x_ring, w_ring, s_ring, full, empty, HALF: gl.constexpr, BLOCK_M: gl.constexpr,
              K_UNITS: gl.constexpr, SLOTS: gl.constexpr):
    """One warpgroup's K loop over its 64 rows (the ring's word blocks ``4 HALF`` on): wait for
    a unit's slot, decode its words, leave its wgmma in flight, and release the slot of the
    unit before, whose wgmma has now retired. Returns the sums (times ``2 ** 64`` undone), in
    ``_mma_layout``."""
    mma: gl.constexpr = _mma_layout(BLOCK_M)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    w_layout: gl.constexpr = words_layout(4)
    acc = gl.zeros((64, BLOCK_M), gl.float32, layout=mma)
    for u in range(K_UNITS):
        slot = u % SLOTS
        mbarrier.wait(full.index(slot), (u // SLOTS) & 1)
        fence_async_shared()  # the copies (generic proxy) before the wgmma's reads (async)
        w = w_ring.index(slot).slice(4 * HALF, 4).load(w_layout)
        s = s_ring.index(slot).slice(4 * HALF, 4).load(gl.SliceLayout(3, w_layout))
        xt = x_ring.index(slot).permute((1, 0))
        acc, _ = unit_mma(w, s, w, s, xt, acc, acc, 64, a_layout, False)
        mbarrier.arrive(empty.index((u + SLOTS - 1) % SLOTS), count=1, pred=u > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc * UNDER


@gluon.constexpr_function
def _mma_layout(BLOCK_M):
    """A warpgroup's wgmma accumulators: 64 weight rows by ``BLOCK_M`` pairs."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                     instr_shape=[16, BLOCK_M, 16])


@gluon.jit
def _copies(p, smem, HALF: gl.constexpr, GATED: gl.constexpr, BLOCK_M: gl.constexpr,
            K_UNITS: gl.constexpr, SLOTS: gl.constexpr, HAS_BIAS: gl.constexpr,
            CLAMPED: gl.constexpr):
    """The copy warpgroup (``_mma``'s arguments, as worker partitions share theirs): each
    unit's x rows, words and scale words into its slot once the slot's last unit is released;
    each thread's copies, when complete, arrive on ``full``."""
    (a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, ws_ptr, bias_ptr, expert, pid_m, pid_n,
     n_pairs, n_out, top_k, alpha, limit, stride_am, stride_we, stride_om, stride_se,
     stride_be) = p
    x_ring, w_ring, s_ring, sums, full, empty, done = smem
    x_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    x_ptrs, x_ok = x_rows(a_ptr, sorted_ptr, pid_m, n_pairs, top_k, stride_am, BLOCK_M, x_layout)
    w_layout: gl.constexpr = words_layout(4)  # four warps, two 16-row blocks each
    nb = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, w_layout))))
    if GATED:  # blocks 4-7: the up rows of blocks 0-3
        blk = pid_n * 4 + nb % 4
        nb = gl.where(blk * 16 < n_out, blk, 0) + gl.where(nb >= 4, n_out // 16, 0)
    else:
        nb = pid_n * 8 + nb
        nb = gl.where(nb * 16 < n_out, nb, 0)  # a ragged last tile reads block 0; never stored
    w_ptrs, s_ptrs, _, _ = word_pointers(w_ptr, ws_ptr, expert, stride_we, stride_se, nb, n_out,
                                         K_UNITS, w_layout)
    for u in range(K_UNITS):
        slot = u % SLOTS
        mbarrier.wait(empty.index(slot), ((u // SLOTS) & 1) ^ 1)  # the first round: at once
        cp_async(x_ring.index(slot), x_ptrs + u * 64, mask=x_ok)
        cp_async(w_ring.index(slot), w_ptrs + u * 128)
        cp_async(s_ring.index(slot), s_ptrs + u * 8)
        async_copy.mbarrier_arrive(full.index(slot), increment_count=False)


def launch_gluon_ws(args: tuple, meta: dict, block_n: int, k_dim: int) -> None:
    """Launch for ``fused_moe._gemm``'s arguments (``launch_args``): a ring of
    ``num_stages`` one-unit slots, 128-row tiles (``block_n``), row blocks of 16 or 32 pairs,
    the registers capped at ``maxnreg`` (``MAXNREG`` where the tile sets none)."""
    if block_n != 128:
        raise ValueError(f"the warp-specialized Gluon tile is 128 rows wide, not {block_n}")
    if meta["BLOCK_M"] not in (16, 32):  # at 64 its sums came out NaN on the GPU
        raise ValueError(f"the warp-specialized Gluon tile takes row blocks of 16 or 32 pairs, "
                         f"not {meta['BLOCK_M']}")
    n_blocks_m, n_out, run, common = launch_args(args, meta, block_n, k_dim)
    common.update(num_warps=4, maxnreg=meta.get("maxnreg") or MAXNREG)
    grid = (n_blocks_m * -(-n_out // (64 if meta["GATED"] else 128)),)
    moe_gemm_mx_frag_ws_kernel[grid](*run, BLOCK_M=meta["BLOCK_M"], SLOTS=meta["num_stages"],
                                     **common)
