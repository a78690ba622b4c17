"""The fused MoE's GEMMs over MXFP4 experts (``fused_moe`` launches them; the decoding is
``mxfp4``'s): ``w [E, N, K/2]`` bytes in the word layout (``quant.mxfp4.to_words``), read as
32-bit words, 16-byte aligned (a group's 16 bytes are 4 words), ``ws [E, N, K/32]`` e8m0 scales,
x in its own dtype.

Three shapes of the same work, chosen by the row block. Row blocks of one (a batch of a few tokens,
each routed pair its own block) take the GEMV on the CUDA cores (``moe_mxfp4_gemv``). Small batches
(16- or 32-row blocks: decode, a few rows per expert) take ``moe_gemm_mx_kernel``: a K step is
whole 32-value groups, each group's words decode without their scale, two dots of depth 16 (x's
even and odd columns) give its partial sums and one multiply by the scale adds them in; no mask,
since K is a multiple of 32. Larger blocks take ``moe_gemm_mx_wide_kernel``, which swaps the
operands so that the decoded, scaled weights feed the tensor cores from registers, and one dot of
depth ``BLOCK_K`` does a step; 16- and 32-row blocks can take it too (``MoeConfig.swapped``), their
tiles' columns then in the order that gives each thread adjacent operand bytes
(``_operand_order``). bf16 tiles on Hopper decode in PTX (``FAST``: ``mxfp4.decode_words_bf16``).
Which kernel and block size win where is measured (``moe_configs``,
``benchmark/kernels/tune_moe.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .moe_tiles import epilogue, tile, tile_rows
from .mxfp4 import BF16X2_TWO126, bf16x2_pow2, decode_words, decode_words_bf16, e8m0
from .pdl import wait_then_release


@triton.jit
def moe_gemm_mx_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, k_dim, top_k, n_blocks_m, alpha, limit,
    stride_am, stride_we, stride_wn, stride_om, stride_se, stride_sn, stride_be,
    GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, FAST: tl.constexpr,
    HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr, GELU: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    """``fused_moe``'s GEMM over MXFP4 weights for small batches. A K step is ``GROUPS``
    32-value groups (``k_dim`` a multiple of 32 * GROUPS): per group, 4 words a row decode into
    its even and odd values, two dots of depth 16 give the group's partial sums, and its scale
    multiplies them into the accumulator. ``FAST`` (bf16 on Hopper): the values decode in PTX
    (``mxfp4.decode_words_bf16``)."""
    wait_then_release(USE_PDL)
    pid_m, pid_n = tile(tl.cdiv(n_out, BLOCK_N), n_blocks_m, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    pair, valid, row, expert, offs_n, n_ok, offs_n_safe = tile_rows(
        sorted_ptr, expert_ids_ptr, pid_m, pid_n, n_pairs, top_k, n_out, BLOCK_M, BLOCK_N)
    a_ptrs = a_ptr + row[:, None] * stride_am + tl.arange(0, 32)[None, :]
    row_words = tl.multiple_of(stride_wn // 4, 4)
    w_ptrs = (expert_words(w_ptr, expert, stride_we) + offs_n_safe[:, None] * row_words
              + tl.arange(0, 4)[None, :])  # a group's words, [BLOCK_N, 4]
    s_ptrs = ws_ptr + expert * stride_se + offs_n_safe * stride_sn
    up = n_out * row_words  # the up rows follow the gate rows (GATED)
    up_s = n_out * stride_sn
    dt = a_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(k_dim // (32 * GROUPS)):
        for g in tl.static_range(GROUPS):
            a = tl.load(a_ptrs + 32 * g, mask=valid[:, None], other=0.0)  # padding rows: not read
            a_even, a_odd = tl.split(tl.reshape(a, (BLOCK_M, 16, 2)))
            lo, hi = _values(tl.load(w_ptrs + 4 * g), dt, FAST)
            part = tl.dot(a_even, lo, input_precision=PRECISION)
            part = tl.dot(a_odd, hi, part, input_precision=PRECISION)
            acc += part * e8m0(tl.load(s_ptrs + g))[None, :]
            if GATED:
                lo, hi = _values(tl.load(w_ptrs + up + 4 * g), dt, FAST)
                part = tl.dot(a_even, lo, input_precision=PRECISION)
                part = tl.dot(a_odd, hi, part, input_precision=PRECISION)
                acc_up += part * e8m0(tl.load(s_ptrs + up_s + g))[None, :]
        a_ptrs += 32 * GROUPS
        w_ptrs += 4 * GROUPS
        s_ptrs += GROUPS
    epilogue(acc, acc_up, out_ptr, weights_ptr, bias_ptr, pair, valid, expert, offs_n, n_ok,
             offs_n_safe, n_out, stride_om, stride_be, alpha, limit, GATED, HAS_BIAS, CLAMPED,
             GELU)


@triton.jit
def expert_words(w_ptr, expert, stride_we):
    """An expert's weights as 32-bit words (strides in bytes, multiples of 16: the launcher
    checks)."""
    w_words = tl.multiple_of(w_ptr.to(tl.pointer_type(tl.int32)), 16)
    return w_words + expert * tl.multiple_of(stride_we // 4, 4)


@triton.jit
def _values(words, dtype: tl.constexpr, FAST: tl.constexpr):
    """A group's words [BLOCK_N, 4] -> its unscaled (even, odd) values as the dot's right
    operands [16, BLOCK_N]; in PTX with ``FAST``."""
    if FAST:
        lo, hi = decode_words_bf16(words, tl.full(words.shape, BF16X2_TWO126, tl.int32))
    else:
        lo, hi = decode_words(words, dtype)
    return tl.trans(lo), tl.trans(hi)


# ``FAST`` wide tiles hold the weights times 2 ** -64 (``_scaled_tile``): the sums are multiplied
# back once, after the K loop
UNDER_SHIFT = tl.constexpr(64)
UNDER = tl.constexpr(1.8446744073709552e19)  # 2 ** 64


@triton.jit
def _scaled_tile(words, s, dtype: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 FAST: tl.constexpr, PERMUTE: tl.constexpr):
    """Words [BLOCK_N, G, 4] and their groups' scales [BLOCK_N, G] -> weights [BLOCK_N, BLOCK_K]
    in ``dtype``, K in order (a byte's low nibble, then its high one), or with ``PERMUTE`` in the
    order ``_operand_order`` gives x's rows. ``FAST`` (bf16 on Hopper: ``mxfp4.decode_words_bf16``,
    the scale in the same packed multiply): the weights times ``2 ** -64``, which keeps the
    scale's bf16 multiplier ``2 ** (s - 1 - 64)`` in range for every scale up to ``2 ** 65``
    (``2 ** (s - 1)`` would overflow from ``2 ** 2``)."""
    if FAST:
        mult = bf16x2_pow2(s.to(tl.int32) - 1 - UNDER_SHIFT)
        lo, hi = decode_words_bf16(words, tl.broadcast_to(mult[:, :, None], words.shape))
    else:
        lo, hi = decode_words(words, tl.float32)
        scale = e8m0(s)[:, :, None]
        lo, hi = (lo * scale).to(dtype), (hi * scale).to(dtype)
    w = tl.join(lo, hi)  # [BLOCK_N, G, 16, 2]: byte c's two values
    if PERMUTE:  # byte c = 8 q + 2 t + h of each 32 becomes operand pair 8 t + 4 h + q
        w = tl.permute(tl.reshape(w, (BLOCK_N, BLOCK_K // 64, 4, 4, 2, 2)), (0, 1, 3, 4, 2, 5))
    return tl.reshape(w, (BLOCK_N, BLOCK_K))


@triton.jit
def _operand_order(x, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr):
    """x's K step [BLOCK_K, BLOCK_M] (rows in K order) -> its rows in a ``PERMUTE``d tile's
    column order. An MMA operand register holds two K-adjacent values, one MXFP4 byte, and a
    thread's next register is 8 values (4 bytes) on: in K order a thread's bytes are 4 apart and
    reach its registers one at a time. Within each 64 values a ``PERMUTE``d tile's pair
    ``8 t + 4 h + q`` is K's pair ``8 q + 2 t + h``, so that the bytes a thread holds (its
    ``q``) are 8 adjacent ones; x's rows follow, so the dot's sum is unchanged."""
    x = tl.permute(tl.reshape(x, (BLOCK_K // 64, 4, 4, 2, 2, BLOCK_M)), (0, 2, 3, 1, 4, 5))
    return tl.reshape(x, (BLOCK_K, BLOCK_M))


@triton.jit
def moe_gemm_mx_wide_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, k_dim, top_k, n_blocks_m, alpha, limit,
    stride_am, stride_we, stride_wn, stride_om, stride_se, stride_sn, stride_be,
    GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr, FAST: tl.constexpr,
    PERMUTE: tl.constexpr, HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr,
    GELU: tl.constexpr = False, USE_PDL: tl.constexpr = False,
):
    """``moe_gemm_mx_kernel`` for tensor-core sized tiles (prefill, decode batches from about 64
    rows an expert, and 16- or 32-row blocks where a tuned config says so), the operands
    swapped: ``out^T = w . x^T``. The decoded weights are the
    dot's left operand, which Hopper's wgmma reads from registers (where they were decoded) and
    which spans the 64-row instruction with output columns; the tokens, however few, are the
    16-wide right operand. Every load is contiguous: a K step's words as [BLOCK_N, groups, 4],
    one scale per group, x's rows whole; the two nibbles of a byte are joined into K order in
    registers, so one dot of depth ``BLOCK_K`` does the step. ``PERMUTE`` (``BLOCK_K`` a multiple
    of 64): the tile's columns and x's rows in ``_operand_order``'s order."""
    wait_then_release(USE_PDL)
    pid_m, pid_n = tile(tl.cdiv(n_out, BLOCK_N), n_blocks_m, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(total_ptr):
        return
    pair, valid, row, expert, offs_n, n_ok, offs_n_safe = tile_rows(
        sorted_ptr, expert_ids_ptr, pid_m, pid_n, n_pairs, top_k, n_out, BLOCK_M, BLOCK_N)
    G: tl.constexpr = BLOCK_K // 32
    offs_k = tl.arange(0, BLOCK_K)
    offs_g = tl.arange(0, G)
    a_ptrs = a_ptr + row[None, :] * stride_am + offs_k[:, None]
    row_words = tl.multiple_of(stride_wn // 4, 4)
    w_ptrs = (expert_words(w_ptr, expert, stride_we) + offs_n_safe[:, None, None] * row_words
              + (4 * offs_g)[None, :, None] + tl.arange(0, 4)[None, None, :])
    s_ptrs = ws_ptr + expert * stride_se + offs_n_safe[:, None] * stride_sn + offs_g[None, :]
    dt = a_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    up_w, up_s = n_out * row_words, n_out * stride_sn  # the up rows, n_out rows on
    last = tl.cdiv(k_dim, BLOCK_K) - 1
    s, s_up = group_loads(s_ptrs, up_s, offs_g, k_dim, 0, BLOCK_K, GATED, EVEN_K, False)
    for k in range(last + 1):
        # the next step's scales loaded before this step's work: Triton stages the words and x,
        # which feed the dot, through shared memory ahead of time, but not the scales, which
        # only scale the words (each step waited for its own); the last loads itself again
        nxt = group_loads(s_ptrs, up_s, offs_g, k_dim, tl.minimum(k + 1, last), BLOCK_K,
                          GATED, EVEN_K, False)
        words, words_up = group_loads(w_ptrs, up_w, offs_g, k_dim, k, BLOCK_K, GATED, EVEN_K,
                                      True)
        if EVEN_K:  # a padding row's x is not read (zeros; its outputs are not stored)
            a = tl.load(a_ptrs, mask=valid[None, :], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=(offs_k < k_dim - k * BLOCK_K)[:, None] & valid[None, :],
                        other=0.0)
        if PERMUTE:
            a = _operand_order(a, BLOCK_K, BLOCK_M)
        w = _scaled_tile(words, s, dt, BLOCK_N, BLOCK_K, FAST, PERMUTE)
        acc = tl.dot(w, a, acc, input_precision=PRECISION)
        if GATED:
            w = _scaled_tile(words_up, s_up, dt, BLOCK_N, BLOCK_K, FAST, PERMUTE)
            acc_up = tl.dot(w, a, acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        s, s_up = nxt
    if FAST:
        acc *= UNDER
        acc_up *= UNDER
    epilogue(tl.trans(acc), tl.trans(acc_up), out_ptr, weights_ptr, bias_ptr, pair, valid, expert,
             offs_n, n_ok, offs_n_safe, n_out, stride_om, stride_be, alpha, limit, GATED,
             HAS_BIAS, CLAMPED, GELU)


@triton.jit
def group_loads(ptrs, up, offs_g, k_dim, k, BLOCK_K: tl.constexpr, GATED: tl.constexpr,
                EVEN_K: tl.constexpr, WORDS: tl.constexpr):
    """K step ``k``'s group scales (``ptrs``: step 0's, [..., G]) or, with ``WORDS``, words
    ([..., G, 4]), and the up rows' (``up`` on; the gate rows' again where not ``GATED``); a
    ragged last step's missing groups 0."""
    G: tl.constexpr = BLOCK_K // 32
    if WORDS:
        ptrs += k * (4 * G)
    else:
        ptrs += k * G
    if EVEN_K:
        v = tl.load(ptrs)
        v_up = v
        if GATED:
            v_up = tl.load(ptrs + up)
    else:
        g_ok = offs_g < (k_dim - k * BLOCK_K) // 32  # K is a multiple of 32
        if WORDS:
            g_ok = g_ok[:, None]
        v = tl.load(ptrs, mask=g_ok, other=0)
        v_up = v
        if GATED:
            v_up = tl.load(ptrs + up, mask=g_ok, other=0)
    return v, v_up


def mx_groups(k_dim: int, block_k: int) -> int:
    """32-value groups per K step: the most that divide ``k_dim`` and fit ``block_k`` values."""
    n = k_dim // 32
    return max(g for g in range(1, max(1, block_k // 32) + 1) if n % g == 0)
