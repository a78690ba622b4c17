"""The fused MoE's MXFP4 GEMV (``fused_moe`` launches it for row blocks of one: a batch of a few
tokens, each routed pair its own block; the tiled kernels are ``moe_mxfp4``'s): its words decoded a
pair of values at a time (``mxfp4.word_pairs``) on the CUDA cores, each thread's products summed
in its registers, no shuffles in the K loop, the next K step's loads in flight meanwhile."""

from __future__ import annotations

import triton
import triton.language as tl

from .moe_mxfp4 import expert_words, group_loads
from .moe_tiles import epilogue, tile, tile_rows
from .mxfp4 import e8m0, widen, word_pairs
from .pdl import wait_then_release

# the GEMV's x times 2 ** 100 against its values' 2 ** -126: its sums times 2 ** 26 at the end
X_UP = tl.constexpr(1.2676506002282294e30)  # 2 ** 100
SUMS_UP = tl.constexpr(67108864.0)  # 2 ** 26


@triton.jit
def moe_gemv_mx_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, k_dim, top_k, n_blocks_m, alpha, limit,
    stride_am, stride_we, stride_wn, stride_om, stride_se, stride_sn, stride_be,
    GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr, GELU: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    """One routed pair a program (row blocks of one, ``block_m == 1``: a batch of a few tokens),
    no tensor cores: ``BLOCK_N`` weight rows read as 32-bit words (a group's 16 bytes are 4
    words, 8 values each, in K order), decoded in float32 and multiplied by x on the CUDA cores,
    a word's values summed in its own registers and scaled per group; the rows' sums are
    reduced once, after the K loop. A dot padded to 16 rows would decode the same weights for 15
    rows of padding. ``w``'s address and strides are multiples of 16 bytes (a row holds K/2
    bytes, K a multiple of 32; the launcher checks), so a thread loads a group's words at once.
    The values stay ``2 ** -126`` times themselves (``mxfp4.word_pairs``: no multiply a
    weight), x is taken times ``2 ** 100`` (exact below ``2 ** 28``), and the sums are multiplied
    by ``2 ** 26`` once, after the K loop."""
    wait_then_release(USE_PDL)
    pid_m, pid_n = tile(tl.cdiv(n_out, BLOCK_N), n_blocks_m, 1)
    if total_ptr is not None:  # else one program a pair, in pair order (``tile_rows``)
        if pid_m >= tl.load(total_ptr):
            return
    pair, valid, row, expert, offs_n, n_ok, offs_n_safe = tile_rows(
        sorted_ptr, expert_ids_ptr, pid_m, pid_n, n_pairs, top_k, n_out, 1, BLOCK_N)
    G: tl.constexpr = BLOCK_K // 32
    offs_g = tl.arange(0, G)
    offs_w = tl.arange(0, 4)
    # x's K step as [G, 4, 8]: value j of word w of group g
    x_ptrs = (a_ptr + row * stride_am + (32 * offs_g)[:, None, None]
              + (8 * offs_w)[None, :, None] + tl.arange(0, 8)[None, None, :])
    row_words = tl.multiple_of(stride_wn // 4, 4)  # a row's K/2 bytes: whole 16-byte groups
    w_ptrs = (expert_words(w_ptr, expert, stride_we) + offs_n_safe[:, None, None] * row_words
              + (4 * offs_g)[None, :, None] + offs_w[None, None, :])
    s_ptrs = ws_ptr + expert * stride_se + offs_n_safe[:, None] * stride_sn + offs_g[None, :]
    up_w, up_s = n_out * row_words, n_out * stride_sn  # the up rows, n_out rows on
    acc = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, G, 4), dtype=tl.float32)
    last = tl.cdiv(k_dim, BLOCK_K) - 1
    x, words, s, words_up, s_up = _step_loads(x_ptrs, w_ptrs, s_ptrs, up_w, up_s, offs_g, k_dim,
                                              0, BLOCK_K, GATED, EVEN_K)
    for k in range(last + 1):
        # the next K step's loads are issued before this step's arithmetic, so their latency
        # hides behind it (Triton pipelines only the loads that feed a dot: without this each
        # step waited for its own words); the last step loads itself again, from the cache
        nxt = _step_loads(x_ptrs, w_ptrs, s_ptrs, up_w, up_s, offs_g, k_dim,
                          tl.minimum(k + 1, last), BLOCK_K, GATED, EVEN_K)
        # x's 8 values of each word apart, in registers: [G, 4] each, value j = 4 c + 2 b + a,
        # paired as ``word_pairs`` pairs the values
        xf = tl.reshape(x.to(tl.float32) * X_UP, (G, 4, 2, 2, 2))
        x_a0, x_a1 = tl.split(xf)
        x0, x4 = tl.split(tl.split(x_a0)[0])
        x2, x6 = tl.split(tl.split(x_a0)[1])
        x1, x5 = tl.split(tl.split(x_a1)[0])
        x3, x7 = tl.split(tl.split(x_a1)[1])
        xs = ((x0, x1), (x2, x3), (x4, x5), (x6, x7))
        acc += _word_dot(words, s, xs)
        if GATED:
            acc_up += _word_dot(words_up, s_up, xs)
        x, words, s, words_up, s_up = nxt
    acc_n = tl.sum(tl.sum(acc, axis=2), axis=1) * SUMS_UP
    acc_up_n = tl.sum(tl.sum(acc_up, axis=2), axis=1) * SUMS_UP
    epilogue(acc_n[None, :], acc_up_n[None, :], out_ptr, weights_ptr, bias_ptr, pair, valid,
             expert, offs_n, n_ok, offs_n_safe, n_out, stride_om, stride_be, alpha, limit, GATED,
             HAS_BIAS, CLAMPED, GELU)


@triton.jit
def _step_loads(x_ptrs, w_ptrs, s_ptrs, up_w, up_s, offs_g, k_dim, k, BLOCK_K: tl.constexpr,
                GATED: tl.constexpr, EVEN_K: tl.constexpr):
    """K step ``k``'s x [G, 4, 8], words [BLOCK_N, G, 4] and scales [BLOCK_N, G], and the up
    rows' (``up_w``, ``up_s`` on; the gate rows' again where not ``GATED``); a ragged last step
    masked (its x and words 0)."""
    words, words_up = group_loads(w_ptrs, up_w, offs_g, k_dim, k, BLOCK_K, GATED, EVEN_K, True)
    s, s_up = group_loads(s_ptrs, up_s, offs_g, k_dim, k, BLOCK_K, GATED, EVEN_K, False)
    x_ptrs += k * BLOCK_K
    if EVEN_K:
        x = tl.load(x_ptrs)
    else:
        g_ok = offs_g < (k_dim - k * BLOCK_K) // 32  # K is a multiple of 32
        x = tl.load(x_ptrs, mask=g_ok[:, None, None], other=0.0)
    return x, words, s, words_up, s_up


@triton.jit
def _word_dot(words, s, xs):
    """Words [BLOCK_N, G, 4] times x (``xs``: its [G, 4] values of each pair of
    ``mxfp4.word_pairs``), scaled by their groups' scales ``s``: [BLOCK_N, G, 4], each a word's 8
    products summed. Two values of every word at once: a rotation and a mask, then two
    operations to widen them to float32."""
    t = tl.zeros(words.shape, dtype=tl.float32)
    pairs = word_pairs(words)
    for j in tl.static_range(4):
        lo, hi = widen(pairs[j])
        t += lo * xs[j][0][None, :, :]  # two statements: two fused multiply-adds
        t += hi * xs[j][1][None, :, :]
    return t * e8m0(s)[:, :, None]
