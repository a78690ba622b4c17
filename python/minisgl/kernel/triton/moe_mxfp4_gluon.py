"""The fragment layout's swapped MXFP4 GEMM in Gluon (Triton's explicit-layout dialect): the
same work as ``moe_mxfp4_frag.moe_gemm_mx_frag_kernel``, without a CTA barrier a K unit.

Each thread loads its 16 bytes of a unit straight into its registers ``AHEAD`` units ahead (a
ring of register sets, the K loop unrolled so that no register is copied), decodes them where
they land (the wgmma A operand as loaded: ``convert_layout(..., assert_trivial=True)`` proves
it) and multiplies them by x's unit in shared memory, one unit's wgmmas left in flight. x, the
block's rows, is copied to shared memory once, all of K (``X_STAGES`` 1: 46 KB for 8 rows at
K = 2,880), or goes through a ring of ``X_STAGES`` stages of ``X_UNITS`` units with one CTA
barrier a stage (``x_stages``), which lets row blocks of 16 to 128 keep several programs an
SM. Through a ring, the words may travel with x (``W_STAGED``): each thread copies its own 16
bytes a unit into the stage's slot and reads them back (no other thread's copy to wait for),
so the stages in flight hold the words, not the registers. With ``HALVES`` each unit's wgmma is
two, 32 deep, the second half decoded while the first runs: half the A registers live, so
under a register cap (more programs an SM) ptxas still keeps the wgmmas in flight where whole
units would have them wait one by one (its info C7513). docs/performance.md has the
instruction counts (``benchmark/kernels/sass_moe.py --kernel gluon``) and timings. The epilogue
is ``moe_tiles.epilogue``'s: biases, the clamped SwiGLU (gpt-oss's) or the routing weight,
stored by pair id; other activations take the Triton kernel (``moe_mxfp4_frag.takes_gluon``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma_wait,
)

from .moe_mxfp4 import UNDER
from .moe_mxfp4_gluon_unit import (
    cp_async,
    cta_barrier,
    epilogue,
    launch_args,
    row_block,
    slot_loads,
    unit_loads,
    unit_mma,
    unit_step,
    word_pointers,
    word_slots,
    words_layout,
    x_rows,
    x_stage,
)


@gluon.jit
def moe_gemm_mx_frag_gluon_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, top_k, alpha, limit, stride_am, stride_we, stride_om, stride_se, stride_be,
    GATED: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, K_UNITS: gl.constexpr,
    X_UNITS: gl.constexpr, X_STAGES: gl.constexpr, AHEAD: gl.constexpr, SPLIT: gl.constexpr,
    W_STAGED: gl.constexpr, HALVES: gl.constexpr, HAS_BIAS: gl.constexpr, CLAMPED: gl.constexpr,
    USE_PDL: gl.constexpr,
    num_warps: gl.constexpr,
):
    """``out^T = w . x^T`` for row blocks of ``BLOCK_M`` pairs of one expert (``w_ptr`` and
    ``ws_ptr`` int32 words, their strides in words). ``GATED`` takes gpt-oss's SwiGLU (clamped
    where ``CLAMPED``): each warp holds gate and up rows, two accumulators, or with ``SPLIT``
    the first half of the warps the tile's gate rows and the second its up rows (``BLOCK_N /
    2`` outputs a tile), paired through shared memory in the epilogue. With ``W_STAGED`` (x
    through a ring) the words travel with x's stages, each thread copying its own into the
    stage's slot and reading them back as its unit comes: ``X_STAGES - 2`` stages of words in
    flight in shared memory instead of ``AHEAD`` units in registers."""
    NB: gl.constexpr = BLOCK_N // 16
    gl.static_assert(not SPLIT or (GATED and NB % 2 == 0))
    TWO: gl.constexpr = GATED and not SPLIT  # gate and up rows in each warp
    COLS: gl.constexpr = BLOCK_N // 2 if SPLIT else BLOCK_N  # outputs a tile
    pid_m, pid_n = row_block(n_out, COLS, USE_PDL)
    if pid_m * BLOCK_M >= gl.load(total_ptr):
        return
    expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)

    # x: the block's rows, all of K copied once, or through a ring of ``X_STAGES`` stages of
    # ``X_UNITS`` units, ``X_STAGES - 2`` in flight, each slot an allocation of its own (the
    # loop unrolled by the ring: Triton's barrier analysis then adds no CTA barrier between
    # copies and wgmmas, and the stages' boundaries are static): a stage's first unit waits
    # for its copies, every thread's (the one barrier a stage), which also finds every warp
    # past the previous stage's first unit, so its wgmmas of the stage before retired: that
    # stage's slots take the copy X_STAGES - 2 on
    STAGED: gl.constexpr = X_STAGES > 1
    gl.static_assert(not STAGED or (X_STAGES >= 3 and K_UNITS % (X_UNITS * X_STAGES) == 0))
    x_layout: gl.constexpr = x_copy_layout(BLOCK_M, num_warps)
    x_shared: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, 64], gl.bfloat16)
    x_ptrs, x_ok = x_rows(a_ptr, sorted_ptr, pid_m, n_pairs, top_k, stride_am, BLOCK_M, x_layout)
    gl.static_assert(STAGED or not W_STAGED)
    if STAGED:
        x_smem = ()
        w_smem = ()
        for i in gl.static_range(X_STAGES * X_UNITS):
            x_smem = x_smem + (gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, 64], x_shared),)
            if W_STAGED:
                w_smem = w_smem + (word_slots(NB, TWO),)
    else:  # the K loop reads it by a unit index that is not static: one allocation
        x_all = gl.allocate_shared_memory(gl.bfloat16, [K_UNITS, BLOCK_M, 64], x_shared)
        for u in gl.static_range(K_UNITS):
            cp_async(x_all.index(u), x_ptrs + u * 64, mask=x_ok)
        async_copy.commit_group()

    w_layout: gl.constexpr = words_layout(NB)
    nb = gl.arange(0, NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, w_layout))))
    if SPLIT:  # warps of the second half: the up rows of the first half's blocks
        blk = pid_n * (NB // 2) + nb % (NB // 2)
        nb = gl.where(blk * 16 < n_out, blk, 0) + gl.where(nb >= NB // 2, n_out // 16, 0)
    else:
        nb = pid_n * NB + nb
        nb = gl.where(nb * 16 < n_out, nb, 0)  # a ragged last tile reads block 0; never stored
    w_ptrs, s_ptrs, up_w, up_s = word_pointers(w_ptr, ws_ptr, expert, stride_we, stride_se, nb,
                                               n_out, K_UNITS, w_layout)

    if STAGED:  # the ring's first stages (after the words' pointers, which they may copy)
        for j in gl.static_range(X_STAGES - 2):
            x_stage(x_smem, x_ptrs, x_ok, j, j, X_UNITS, w_smem, w_ptrs, s_ptrs, up_w, up_s,
                    W_STAGED, TWO)

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BLOCK_M, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    acc = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, layout=mma)
    acc_up = acc
    if TWO:
        acc_up = gl.zeros((BLOCK_N, BLOCK_M), gl.float32, layout=mma)
    # a ring of AHEAD units' loads in flight, each unit's step loading the unit AHEAD on, then
    # multiplying the oldest: the K loop unrolled by AHEAD + 1 (the ring of x: by its units) so
    # that no register moves; none where the words are staged with x
    RING: gl.constexpr = AHEAD + 1
    last: gl.constexpr = K_UNITS - 1
    ring = ()
    if not W_STAGED:
        ring = (unit_loads(w_ptrs, s_ptrs, up_w, up_s, 0, TWO),)
        for i in gl.static_range(1, AHEAD):
            ring = ring + (unit_loads(w_ptrs, s_ptrs, up_w, up_s, i if i < last else last, TWO),)
    if STAGED:
        for u0 in range(0, K_UNITS, X_STAGES * X_UNITS):
            for st in gl.static_range(X_STAGES):
                async_copy.wait_group(X_STAGES - 3)  # the barrier next: Triton adds none
                cta_barrier()
                fence_async_shared()
                nxt = u0 // X_UNITS + st + X_STAGES - 2
                if nxt < K_UNITS // X_UNITS:
                    x_stage(x_smem, x_ptrs, x_ok, nxt, (st + X_STAGES - 2) % X_STAGES,
                            X_UNITS, w_smem, w_ptrs, s_ptrs, up_w, up_s, W_STAGED, TWO)
                else:
                    async_copy.commit_group()  # empty: the stages after each stay its groups
                for v in gl.static_range(X_UNITS):
                    xt = x_smem[st * X_UNITS + v].permute((1, 0))
                    if W_STAGED:
                        w, sc, wu, su = slot_loads(w_smem[st * X_UNITS + v], w_layout, TWO)
                        acc, acc_up = unit_mma(w, sc, wu, su, xt, acc, acc_up, BLOCK_N,
                                               a_layout, TWO, HALVES)
                    else:
                        ring, acc, acc_up = unit_step(
                            ring, w_ptrs, s_ptrs, up_w, up_s, u0 + st * X_UNITS + v, xt, acc,
                            acc_up, AHEAD, K_UNITS, BLOCK_N, a_layout, TWO, HALVES)
    else:
        async_copy.wait_group(0)
        cta_barrier()
        fence_async_shared()
        for u0 in range(0, K_UNITS - K_UNITS % RING, RING):
            for i in gl.static_range(RING):
                ring, acc, acc_up = unit_step(
                    ring, w_ptrs, s_ptrs, up_w, up_s, u0 + i, x_all.index(u0 + i).permute((1, 0)),
                    acc, acc_up, AHEAD, K_UNITS, BLOCK_N, a_layout, TWO, HALVES)
        for i in gl.static_range(K_UNITS % RING):
            w, sc, wu, su = ring[i]
            xt = x_all.index(K_UNITS - K_UNITS % RING + i).permute((1, 0))
            acc, acc_up = unit_mma(w, sc, wu, su, xt, acc, acc_up, BLOCK_N, a_layout, TWO,
                                   HALVES)
    acc, acc_up = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_up))
    acc = acc * UNDER  # the values' 2 ** -64 (``moe_mxfp4.UNDER_SHIFT``)
    if SPLIT:  # gate rows above, up rows below: each to its output's thread
        e_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, num_warps], [0, 1])
        e_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_M],
                                           gl.SwizzledSharedLayout(1, 1, 1, [0, 1]), acc)
        epilogue(e_smem.slice(0, COLS).load(e_layout), e_smem.slice(COLS, COLS).load(e_layout),
                  out_ptr, weights_ptr, sorted_ptr, bias_ptr, pid_m, pid_n, expert, n_pairs,
                  n_out, alpha, limit, stride_om, stride_be, GATED, BLOCK_M, BLOCK_M, COLS,
                  HAS_BIAS, CLAMPED, e_layout)
    else:
        epilogue(acc, acc_up * UNDER, out_ptr, weights_ptr, sorted_ptr, bias_ptr, pid_m, pid_n,
                  expert, n_pairs, n_out, alpha, limit, stride_om, stride_be, GATED, BLOCK_M,
                  BLOCK_M, COLS, HAS_BIAS, CLAMPED, mma)


@gluon.constexpr_function
def x_copy_layout(BLOCK_M, num_warps):
    """x's [BLOCK_M, 64] unit over the program's threads, 16 bytes a thread where the rows fill
    its warps (four rows a warp), else fewer, so that no two threads copy the same values down
    to 4 bytes a thread (row blocks of two a warp). A copy of the same values by two warps
    makes ptxas serialize every wgmma of the kernel (its info C7513: "non wgmma instructions
    defining input registers of a wgmma between start and end of the pipeline stage"), each
    waited on before the next: so did the row blocks of 16 on 8 warps and of 8 on 4."""
    vec = max(2, min(8, 2 * BLOCK_M // num_warps))  # bf16 values a thread
    return gl.BlockedLayout([1, vec], [vec // 2, 64 // vec], [num_warps, 1], [1, 0])


def x_stages(k_units: int, block_m: int, block_k: int, num_stages: int) -> tuple[int, int]:
    """x's stages (units a stage, stages) for a tile's ``block_k`` and ``num_stages``: below
    three stages, one stage of every unit (it must fit in shared memory); else a ring of
    ``num_stages`` stages of ``block_k / 64`` units, the ring's units dividing K's."""
    units = block_k // 64
    if num_stages < 3:
        if k_units * block_m * 128 > 160 * 1024:
            raise ValueError(f"x's {k_units} units of {block_m} rows do not fit in shared "
                             f"memory at once: take num_stages >= 3 (a ring)")
        return k_units, 1
    if k_units % (units * num_stages):
        raise ValueError(f"a ring of {num_stages} stages of {units} units (block_k {block_k}): "
                         f"its units must divide K's {k_units}")
    return units, num_stages


def launch_gluon(args: tuple, meta: dict, block_n: int, k_dim: int) -> None:
    """Launch for ``fused_moe._gemm``'s arguments (``launch_args``): x in the stages of
    ``x_stages`` for the tile's ``BLOCK_K`` and ``num_stages``, a gated tile's gate and up rows
    in separate warps where ``SPLIT``, the words through x's ring where ``W_STAGED``."""
    n_blocks_m, n_out, run, common = launch_args(args, meta, block_n, k_dim)
    split = meta["GATED"] and meta["SPLIT"]
    x_units, n_stages = x_stages(k_dim // 64, meta["BLOCK_M"], meta["BLOCK_K"],
                                 meta["num_stages"])
    grid = (n_blocks_m * -(-n_out // (block_n // 2 if split else block_n)),)
    if meta["W_STAGED"] and n_stages < 3:
        raise ValueError("the words travel through x's ring: num_stages must be 3 or more")
    moe_gemm_mx_frag_gluon_kernel[grid](*run, BLOCK_M=meta["BLOCK_M"], X_UNITS=x_units,
                                        X_STAGES=n_stages, SPLIT=split,
                                        W_STAGED=meta["W_STAGED"],
                                        HALVES=meta["HALVES"], **common)
