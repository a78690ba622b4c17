"""The fused MoE's MXFP4 GEMV over the fragment layout (``quant.mxfp4_fragments``; the tiles
are ``moe_mxfp4_frag``'s): ``moe_mxfp4_gemv``'s work (row blocks of one, the words decoded on the
CUDA cores, the next K step's loads in flight), each thread reading the 16 bytes of two rows a
wgmma lane holds, with the x values of its own words.

Where x is one load whose values every row's lanes share, Triton gives it a layout of its own and
converts it to the words' in the K loop, through shared memory between CTA barriers. Loaded as
tensors with fewer elements than the program's threads, Triton's layout pass does not keep their
loads' layouts: it loads them in the layout their use takes, each thread its own values
(docs/performance.md, "Why the fragment layout is slower at batch 1").
"""

from __future__ import annotations

import triton
import triton.language as tl

from .moe_mxfp4 import expert_words
from .moe_mxfp4_gemv import SUMS_UP, X_UP
from .moe_tiles import epilogue, tile, tile_rows
from .mxfp4 import e8m0, widen, word_pairs
from .pdl import wait_then_release


@triton.jit
def moe_gemv_mx_frag_kernel(
    a_ptr, w_ptr, out_ptr, weights_ptr, sorted_ptr, expert_ids_ptr, total_ptr, ws_ptr, bias_ptr,
    n_pairs, n_out, k_dim, top_k, n_blocks_m, alpha, limit,
    stride_am, stride_we, stride_wn, stride_om, stride_se, stride_sn, stride_be,
    GATED: tl.constexpr, BLOCK_N: tl.constexpr, UNITS: tl.constexpr, EVEN_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, CLAMPED: tl.constexpr, GELU: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    """``moe_mxfp4_gemv``'s GEMV over the fragment layout: one routed pair a program,
    ``BLOCK_N`` rows (16-row units) and ``UNITS`` 64-deep units a K step (``EVEN_K``: ``k_dim``
    a multiple of ``64 * UNITS``; else the last step's missing units are masked). A thread's
    words are decoded and multiplied by x on the CUDA cores, each word's eight products summed
    in its registers and scaled by its own scale; a row's values lie in four lanes (``q``),
    summed once after the K loop. The next step's loads are issued before this step's
    arithmetic. x is loaded as sixteen small tensors a step (``_x_loads``), so that each thread
    reads the values its own words take (the lanes of other rows the same addresses) and
    nothing passes through shared memory. Values ``2 ** -126`` times themselves, x times
    ``2 ** 100``, the sums times ``2 ** 26`` at the end, as there."""
    wait_then_release(USE_PDL)
    pid_m, pid_n = tile(tl.cdiv(n_out, BLOCK_N), n_blocks_m, 1)
    if total_ptr is not None:  # else one program a pair, in pair order (``tile_rows``)
        if pid_m >= tl.load(total_ptr):
            return
    pair, valid, row, expert, offs_n, n_ok, offs_n_safe = tile_rows(
        sorted_ptr, expert_ids_ptr, pid_m, pid_n, n_pairs, top_k, n_out, 1, BLOCK_N)
    NB: tl.constexpr = BLOCK_N // 16
    units = k_dim // 64
    nb = pid_n * NB + tl.arange(0, NB)
    nb = tl.where(nb * 16 < n_out, nb, 0)
    u = tl.arange(0, UNITS)[None, :, None, None, None]
    r = tl.arange(0, 8)[None, None, :, None, None]
    q = tl.arange(0, 4)[None, None, None, :, None]
    hg = tl.arange(0, 4)[None, None, None, None, :]
    unit0 = nb[:, None, None, None, None] * units + u  # [NB, UNITS, 1, 1, 1]
    w_ptrs = expert_words(w_ptr, expert, stride_we) + unit0 * 128 + r * 16 + q * 4 + hg
    s_ptrs = ws_ptr + expert * stride_se + unit0 * 32 + r * 4 + 0 * q + hg
    up_w, up_s = (n_out // 16) * units * 128, (n_out // 16) * units * 32
    # x of word (h, g) of lane q, its pair j's element p: K 64 u + 32 g + 8 j + 2 q + p
    x_ptrs = a_ptr + row * stride_am + 64 * tl.arange(0, UNITS)[:, None] + 2 * tl.arange(0, 4)
    acc = tl.zeros((NB, UNITS, 8, 4, 2, 2), dtype=tl.float32)
    acc_up = tl.zeros((NB, UNITS, 8, 4, 2, 2), dtype=tl.float32)
    steps = tl.cdiv(units, UNITS)
    xs, words, s, words_up, s_up = _gemv_loads(x_ptrs, w_ptrs, s_ptrs, up_w, up_s, units, 0,
                                               UNITS, GATED, EVEN_K)
    for k in range(steps):
        nxt = _gemv_loads(x_ptrs, w_ptrs, s_ptrs, up_w, up_s, units,
                          tl.minimum(k + 1, steps - 1), UNITS, GATED, EVEN_K)
        acc += _frag_word_dot(words, s, xs)
        if GATED:
            acc_up += _frag_word_dot(words_up, s_up, xs)
        xs, words, s, words_up, s_up = nxt
    out = _rows(acc, NB, UNITS) * SUMS_UP
    out_up = _rows(acc_up, NB, UNITS) * SUMS_UP
    epilogue(out[None, :], out_up[None, :], out_ptr, weights_ptr, bias_ptr, pair, valid, expert,
             offs_n, n_ok, offs_n_safe, n_out, stride_om, stride_be, alpha, limit, GATED,
             HAS_BIAS, CLAMPED, GELU)


@triton.jit
def _x_loads(x_ptrs, units, k, UNITS: tl.constexpr, EVEN_K: tl.constexpr):
    """K step ``k``'s x as each unit's two 32-value groups g, four pairs j of
    ``mxfp4.word_pairs`` each (``_x_pair``); units past ``units`` 0."""
    x_ptrs += k * 64 * UNITS
    ok = (k * UNITS + tl.arange(0, UNITS)) < units
    return ((_x_pair(x_ptrs, 0, ok, EVEN_K), _x_pair(x_ptrs, 8, ok, EVEN_K),
             _x_pair(x_ptrs, 16, ok, EVEN_K), _x_pair(x_ptrs, 24, ok, EVEN_K)),
            (_x_pair(x_ptrs, 32, ok, EVEN_K), _x_pair(x_ptrs, 40, ok, EVEN_K),
             _x_pair(x_ptrs, 48, ok, EVEN_K), _x_pair(x_ptrs, 56, ok, EVEN_K)))


@triton.jit
def _x_pair(x_ptrs, offset: tl.constexpr, ok, EVEN_K: tl.constexpr):
    """The (low, high) values of one pair of every lane q's words, [UNITS, 4 (q)] each, in
    float32 times ``2 ** 100``. Tensors of fewer elements than a program's threads: Triton
    loads them in the layout their use takes (a larger load keeps its own, and a conversion
    through shared memory follows)."""
    if EVEN_K:
        lo = tl.load(x_ptrs + offset)
        hi = tl.load(x_ptrs + offset + 1)
    else:
        lo = tl.load(x_ptrs + offset, mask=ok[:, None], other=0.0)
        hi = tl.load(x_ptrs + offset + 1, mask=ok[:, None], other=0.0)
    return lo.to(tl.float32) * X_UP, hi.to(tl.float32) * X_UP


@triton.jit
def _gemv_loads(x_ptrs, w_ptrs, s_ptrs, up_w, up_s, units, k, UNITS: tl.constexpr,
                GATED: tl.constexpr, EVEN_K: tl.constexpr):
    """K step ``k``'s x (``_x_loads``), words [NB, UNITS, 8, 4, 2 (h), 2 (g)] and scales (the
    same shape), and the up rows' (the gate rows' again where not ``GATED``); units past
    ``units`` 0."""
    if EVEN_K:
        words = tl.load(w_ptrs + k * 128 * UNITS)
        s = tl.load(s_ptrs + k * 32 * UNITS)
    else:
        u = k * UNITS + tl.arange(0, UNITS)
        ok = (u < units)[None, :, None, None, None]
        words = tl.load(w_ptrs + k * 128 * UNITS, mask=ok, other=0)
        s = tl.load(s_ptrs + k * 32 * UNITS, mask=ok, other=0)
    words_up, s_up = words, s
    if GATED:
        if EVEN_K:
            words_up = tl.load(w_ptrs + up_w + k * 128 * UNITS)
            s_up = tl.load(s_ptrs + up_s + k * 32 * UNITS)
        else:
            words_up = tl.load(w_ptrs + up_w + k * 128 * UNITS, mask=ok, other=0)
            s_up = tl.load(s_ptrs + up_s + k * 32 * UNITS, mask=ok, other=0)
    return (_x_loads(x_ptrs, units, k, UNITS, EVEN_K), _hg(words), _hg(s), _hg(words_up),
            _hg(s_up))


@triton.jit
def _hg(t):
    """[NB, UNITS, 8, 4, 4 (h, g)] -> [NB, UNITS, 8, 4, 2, 2] (a thread's four words apart)."""
    return tl.reshape(t, t.shape[:4] + (2, 2))


@triton.jit
def _frag_word_dot(words, s, xs):
    """Words [NB, UNITS, 8, 4, 2 (h), 2 (g)] times their x (``xs``), each word's 8 products
    summed and scaled by its scale: [NB, UNITS, 8, 4, 2, 2]."""
    g0, g1 = tl.split(words)
    return tl.join(_group_dot(g0, xs[0]), _group_dot(g1, xs[1])) * e8m0(s)


@triton.jit
def _group_dot(words, xs):
    """One group's words [NB, UNITS, 8, 4, 2 (h)] times their x: each word's 8 products."""
    t = tl.zeros(words.shape, dtype=tl.float32)
    pairs = word_pairs(words)
    for j in tl.static_range(4):
        lo, hi = widen(pairs[j])
        t += lo * xs[j][0][None, :, None, :, None]
        t += hi * xs[j][1][None, :, None, :, None]
    return t


@triton.jit
def _rows(acc, NB: tl.constexpr, UNITS: tl.constexpr):
    """[NB, UNITS, r, q, h, g] sums -> each row's, [BLOCK_N] in the order 16 nb + 8 h + r."""
    t = tl.sum(tl.sum(tl.sum(acc, axis=5), axis=3), axis=1)  # [NB, r, h]
    return tl.reshape(tl.permute(t, (0, 2, 1)), (NB * 16,))
