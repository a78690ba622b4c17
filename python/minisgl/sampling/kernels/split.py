"""Split-row sampling: the default Triton path; the one-program-per-row kernel
(``row.py``) finishes the rows this path cannot decide exactly.

    stats kernel, grid (B, S)    one program per CHUNK columns of a row, one read: the scaled values
                                 x (penalties, bias, bitmask, / T): chunk max and first argmax,
                                 sum exp(x - max) when top_p needs the full normaliser, the race
                                 winner of rows with no filter; the raw logits' max and sumexp
                                 (log-probs)
    threshold kernel, grid (B,)  the row's threshold t from its chunk maxima: the k-th largest of
                                 them (k = top_k, or GUESS for rows without one; at least k values
                                 are >= it, so every top_k token is), raised to the min_p floor (or
                                 the floor itself for min_p rows without top_k); with top log-probs
                                 asked, the top_n-th largest raw chunk max
    collect kernel, grid (B, S)  chunks whose max is below t return at once; the others re-read
                                 their columns and append every finite x >= t to the row's
                                 candidates (an atomic counter, at most CAP kept); the same for the
                                 raw logits and their threshold
    merge kernel, grid (B,)      global max / argmax / logsumexp / race winner; the top n raw
                                 logits (the top log-probs, no torch.topk over the vocabulary);
                                 filtered rows sort their candidates and run the reference's scan
                                 (min_p floor, top_k with ties, top_p nucleus) and the race on them.
                                 Every token >= t is a candidate, so the result is exact when the
                                 candidates fit (count <= CAP), hold the kept set (count >= top_k,
                                 or t is the min_p floor) and, for top_p alone, the nucleus closes
                                 inside them (their mass >= top_p * Z); otherwise the row is flagged
    row kernel, grid (B,)        ``row.sample_kernel``: flagged rows only (the others return)

The logits are read a little more than once (the collect kernel re-reads the chunks that reach
t: about top_k of the S); no sort of the vocabulary and no host sync (timings:
docs/performance.md, "Measurements behind the code").
``launch.sample_rows`` launches them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .row import draw_state, log_e, row_adjust, tile_values

NSTAT = 5  # floats per chunk record: max, sumexp, race best, raw max, raw sumexp
GUESS = 16  # rows without top_k collect the tokens >= the GUESS-th largest chunk max
_BIG = tl.constexpr(2147483647)
_I64_MIN = tl.constexpr(-9223372036854775808)


@triton.jit
def _key(v, idx):
    """int64 keys ordered like (value descending, index ascending)."""
    bits = v.to(tl.int32, bitcast=True)
    kb = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (kb.to(tl.int64) << 32) + (4294967295 - idx.to(tl.int64))


@triton.jit
def _unkey(key):
    kb = (key >> 32).to(tl.int32)
    v = (kb ^ ((kb >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    idx = (4294967295 - (key & 4294967295)).to(tl.int32)
    return tl.where(key == -9223372036854775808, float("-inf"), v), idx


@triton.jit
def _kth_largest(stats_ptr, row, S, field, kk, S_PAD: tl.constexpr):
    """The kk-th largest of the row's S chunk values ``stats[row, :, field]`` (at least kk of them
    are >= it; -inf when fewer than kk are finite)."""
    si = tl.arange(0, S_PAD)
    live = si < S
    base = stats_ptr + row.to(tl.int64) * S * 5 + field
    v = tl.load(base + si * 5, mask=live, other=float("-inf"))
    ge = tl.zeros([S_PAD], tl.int32)
    for i0 in range(0, S, 32):
        ii = i0 + tl.arange(0, 32)
        vi = tl.load(base + ii * 5, mask=ii < S, other=float("-inf"))
        ge += tl.sum(((ii < S)[:, None] & (vi[:, None] >= v[None, :])).to(tl.int32), 0)
    return tl.max(tl.where(live & (ge >= kk), v, float("-inf")), 0), tl.max(v, 0)


@triton.jit
def _append(cand_ptr, cnt_ptr, x, offs, tau, CAP: tl.constexpr):
    """Append the keys of every finite x >= tau to a candidates row (an atomic count; at most CAP
    stored, the count tells the merge whether they all fit)."""
    sel = (x >= tau) & (x > float("-inf"))
    n = tl.sum(sel.to(tl.int32), 0)
    if n > 0:
        pos = tl.atomic_add(cnt_ptr, n) + tl.cumsum(sel.to(tl.int32), 0) - 1
        tl.store(cand_ptr + pos, _key(x, offs), mask=sel & (pos < CAP))


@triton.jit
def _row_filters(temps_ptr, top_k_ptr, top_p_ptr, min_p_ptr, row, V):
    """A row's settings: temperature, top_k, top_p, min_p, whether top_k / min_p are on and
    whether the row is filtered (sampled with any of the three)."""
    temp = tl.load(temps_ptr + row)
    k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    use_k = k < V
    use_min = min_p > 0.0
    return temp, k, top_p, min_p, use_k, use_min, (temp > 0.0) & (use_k | (top_p < 1.0) | use_min)


@triton.jit
def stats_kernel(
    logits_ptr, V, temps_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seeds_ptr, steps_ptr, counts_ptr,
    count_rows_ptr, pres_ptr, freq_ptr, rep_ptr, bias_ptr, bias_rows_ptr, mask_ptr, W,
    stats_ptr, args_ptr, cnt_ptr, S,
    HAS_COUNTS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    NEED_LSE: tl.constexpr, LIBDEVICE: tl.constexpr, CHUNK: tl.constexpr,
):
    row = tl.program_id(0)
    s = tl.program_id(1)
    temp, _, _, _, use_k, use_min, filtered = _row_filters(temps_ptr, top_k_ptr, top_p_ptr,
                                                           min_p_ptr, row, V)
    t = tl.where(temp <= 0.0, 1.0, temp)
    race_now = (temp > 0.0) & (~filtered)
    need_z = filtered & (~use_k) & (~use_min)  # top_p alone: the nucleus needs the full Z
    crow, rep, freq, pres, brow = row_adjust(count_rows_ptr, rep_ptr, freq_ptr, pres_ptr,
                                             bias_rows_ptr, row, HAS_COUNTS, HAS_BIAS)
    offs = s * CHUNK + tl.arange(0, CHUNK)
    raw, x = tile_values(logits_ptr, row, offs, offs < V, V, t, counts_ptr, crow, rep, freq, pres,
                         bias_ptr, brow, mask_ptr, W, HAS_COUNTS, HAS_BIAS, HAS_MASK)
    m = tl.max(x, 0)
    arg = tl.min(tl.where(x == m, offs, _BIG), 0)
    z = 0.0
    if need_z & (m > float("-inf")):
        z = tl.sum(tl.exp(x - m), 0)
    best = float("-inf")
    best_i = arg
    if race_now:
        row_state = draw_state(seeds_ptr, steps_ptr, row)
        score = tl.where(x > float("-inf"), x - log_e(row_state, offs, LIBDEVICE), float("-inf"))
        best = tl.max(score, 0)
        best_i = tl.min(tl.where(score == best, offs, _BIG), 0)
    raw_m = float("-inf")
    raw_s = 0.0
    if NEED_LSE:
        raw_m = tl.max(raw, 0)
        if raw_m > float("-inf"):
            raw_s = tl.sum(tl.exp(raw - raw_m), 0)
    rec = row.to(tl.int64) * S + s
    tl.store(stats_ptr + rec * 5, m)
    tl.store(stats_ptr + rec * 5 + 1, z)
    tl.store(stats_ptr + rec * 5 + 2, best)
    tl.store(stats_ptr + rec * 5 + 3, raw_m)
    tl.store(stats_ptr + rec * 5 + 4, raw_s)
    tl.store(args_ptr + rec * 2, arg)
    tl.store(args_ptr + rec * 2 + 1, best_i)
    if s == 0:  # the collect kernel's counters (it runs after this one)
        tl.store(cnt_ptr + row * 2 + tl.arange(0, 2), tl.zeros([2], tl.int32))


@triton.jit(do_not_specialize=["top_n"])  # one variant for every top_logprobs
def threshold_kernel(
    V, temps_ptr, top_k_ptr, top_p_ptr, min_p_ptr, stats_ptr, tau_ptr, S, top_n,
    S_PAD: tl.constexpr, GUESS: tl.constexpr, NT: tl.constexpr,
):
    """Per row: the candidates' threshold (+inf: none) and the raw one for top log-probs."""
    row = tl.program_id(0)
    _, k, _, min_p, use_k, use_min, filtered = _row_filters(temps_ptr, top_k_ptr, top_p_ptr,
                                                            min_p_ptr, row, V)
    tau = float("inf")
    if filtered:
        tau, m = _kth_largest(stats_ptr, row, S, 0, tl.minimum(tl.where(use_k, k, GUESS), S), S_PAD)
        floor = tl.where(use_min, m + tl.log(min_p), float("-inf"))
        tau = tl.where(use_min & (~use_k), floor, tl.maximum(tau, floor))
    tl.store(tau_ptr + row * 2, tau)
    if NT > 0:
        rtau, _ = _kth_largest(stats_ptr, row, S, 3, tl.minimum(top_n, S), S_PAD)
        tl.store(tau_ptr + row * 2 + 1, rtau)


@triton.jit
def collect_kernel(
    logits_ptr, V, temps_ptr, counts_ptr, count_rows_ptr, pres_ptr, freq_ptr, rep_ptr, bias_ptr,
    bias_rows_ptr, mask_ptr, W, stats_ptr, cnt_ptr, cand_ptr, rcand_ptr, tau_ptr, S,
    HAS_COUNTS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    CHUNK: tl.constexpr, CAP: tl.constexpr, NT: tl.constexpr, CPP: tl.constexpr,
):
    """CPP chunks per program: most chunks hold no candidate, so a program per chunk would mostly
    start and return."""
    row = tl.program_id(0)
    tau = tl.load(tau_ptr + row * 2)
    rtau = tl.load(tau_ptr + row * 2 + 1) if NT > 0 else float("inf")
    for j in range(CPP):
        s = tl.program_id(1) * CPP + j
        rec = row.to(tl.int64) * S + s
        offs = s * CHUNK + tl.arange(0, CHUNK)
        mine = tl.load(stats_ptr + rec * 5, mask=s < S, other=float("-inf"))
        if (mine >= tau) & (mine > float("-inf")):  # this chunk holds candidates
            temp = tl.load(temps_ptr + row)
            crow, rep, freq, pres, brow = row_adjust(count_rows_ptr, rep_ptr, freq_ptr, pres_ptr,
                                                     bias_rows_ptr, row, HAS_COUNTS, HAS_BIAS)
            _, x = tile_values(logits_ptr, row, offs, offs < V, V, temp, counts_ptr, crow, rep,
                               freq, pres, bias_ptr, brow, mask_ptr, W, HAS_COUNTS, HAS_BIAS,
                               HAS_MASK)
            _append(cand_ptr + row.to(tl.int64) * CAP, cnt_ptr + row * 2, x, offs, tau, CAP)
        if NT > 0:  # the top n raw logits: every raw logit >= the n-th largest raw chunk max
            mine = tl.load(stats_ptr + rec * 5 + 3, mask=s < S, other=float("-inf"))
            if (mine >= rtau) & (mine > float("-inf")):
                raw = tl.load(logits_ptr + row.to(tl.int64) * V + offs, mask=offs < V,
                              other=float("-inf")).to(tl.float32)
                _append(rcand_ptr + row.to(tl.int64) * CAP, cnt_ptr + row * 2 + 1, raw, offs,
                        rtau, CAP)


@triton.jit(do_not_specialize=["top_n"])
def merge_kernel(
    logits_ptr, V, tokens_ptr, lse_ptr, flags_ptr, temps_ptr, top_k_ptr, top_p_ptr, min_p_ptr,
    seeds_ptr, steps_ptr, counts_ptr, count_rows_ptr, stats_ptr, args_ptr, cnt_ptr, cand_ptr,
    rcand_ptr, tau_ptr, top_ids_ptr, top_vals_ptr, S, top_n,
    HAS_COUNTS: tl.constexpr, NEED_LSE: tl.constexpr, LIBDEVICE: tl.constexpr,
    S_PAD: tl.constexpr, CAP: tl.constexpr, NT: tl.constexpr, RB: tl.constexpr,
):
    row = tl.program_id(0)
    temp, k, top_p, min_p, use_k, use_min, filtered = _row_filters(temps_ptr, top_k_ptr, top_p_ptr,
                                                                   min_p_ptr, row, V)
    race_now = (temp > 0.0) & (~filtered)
    si = tl.arange(0, S_PAD)
    live = si < S
    rec = row.to(tl.int64) * S + si
    m_s = tl.load(stats_ptr + rec * 5, mask=live, other=float("-inf"))
    m = tl.max(m_s, 0)
    token = tl.min(tl.where(live & (m_s == m), tl.load(args_ptr + rec * 2, mask=live, other=0),
                            _BIG), 0)
    flag = 0
    if NEED_LSE:
        rm_s = tl.load(stats_ptr + rec * 5 + 3, mask=live, other=float("-inf"))
        rm = tl.max(rm_s, 0)
        rs_s = tl.load(stats_ptr + rec * 5 + 4, mask=live, other=0.0)
        rs = tl.sum(tl.where(rm_s > float("-inf"), rs_s * tl.exp(rm_s - rm), 0.0), 0)
        tl.store(lse_ptr + row, rm + tl.log(rs))
    ci = tl.arange(0, CAP)
    if NT > 0:  # the top n raw logits, from the candidates when they hold them all
        rn = tl.load(cnt_ptr + row * 2 + 1)
        if (rn <= CAP) & ((top_n <= S) | (rn >= top_n)):
            top = tl.topk(tl.load(rcand_ptr + row.to(tl.int64) * CAP + ci, mask=ci < rn,
                                  other=_I64_MIN), NT)
        else:  # flat or tied rows: a pass over the row, keeping the running top NT
            top = tl.full([NT], _I64_MIN, tl.int64)
            for c0 in range(0, V, RB):
                offs = c0 + tl.arange(0, RB)
                raw = tl.load(logits_ptr + row.to(tl.int64) * V + offs, mask=offs < V,
                              other=float("-inf")).to(tl.float32)
                blk = tl.topk(tl.where(offs < V, _key(raw, offs), _I64_MIN), NT)
                both = tl.where(tl.arange(0, 2)[:, None] == 0, top[None, :], blk[None, :])
                top = tl.topk(tl.reshape(both, [2 * NT]), NT)
        tv, tid = _unkey(top)
        tl.store(top_ids_ptr + row.to(tl.int64) * NT + tl.arange(0, NT), tid.to(tl.int64))
        tl.store(top_vals_ptr + row.to(tl.int64) * NT + tl.arange(0, NT), tv)
    if race_now:
        b_s = tl.load(stats_ptr + rec * 5 + 2, mask=live, other=float("-inf"))
        best = tl.max(b_s, 0)
        bi_s = tl.load(args_ptr + rec * 2 + 1, mask=live, other=_BIG)
        token = tl.min(tl.where(live & (b_s == best), bi_s, _BIG), 0)
        if best == float("-inf"):
            flag = 1
    if filtered:
        n = tl.load(cnt_ptr + row * 2)
        tau = tl.load(tau_ptr + row * 2)
        keys = tl.load(cand_ptr + row.to(tl.int64) * CAP + ci, mask=ci < n, other=_I64_MIN)
        v, idx = _unkey(tl.sort(keys, descending=True))
        floor = tl.where(use_min, m + tl.log(min_p), float("-inf"))
        cnt_floor = tl.sum(((v >= floor) & (v > float("-inf"))).to(tl.int32), 0)
        n_keep = tl.where(use_k, tl.minimum(cnt_floor, k), cnt_floor)
        # the reference's sorted scan, on the candidates (every token >= tau is one)
        probs = tl.where(ci < n_keep, tl.exp(v - m), 0.0)
        z_s = tl.load(stats_ptr + rec * 5 + 1, mask=live, other=0.0)
        z = tl.sum(tl.where(m_s > float("-inf"), z_s * tl.exp(m_s - m), 0.0), 0)
        z_k = tl.where(use_k | use_min, tl.sum(probs, 0), z)
        before = tl.cumsum(probs, 0) - probs
        nucleus = tl.where(top_p >= 1.0, ci < n_keep, (before < top_p * z_k) & (ci < n_keep))
        n_final = tl.maximum(tl.sum(nucleus.to(tl.int32), 0), 1)
        b = tl.sum(tl.where(ci == n_final - 1, v, 0.0), 0)
        row_state = draw_state(seeds_ptr, steps_ptr, row)
        score = tl.where(v >= b, v - log_e(row_state, idx, LIBDEVICE), float("-inf"))
        best = tl.max(score, 0)
        token = tl.min(tl.where(score == best, idx, _BIG), 0)
        # exact when the candidates hold the kept set: all finite tokens (tau -inf), every token
        # >= the min_p floor (tau is the floor), the top k (count >= k), or for top_p alone a
        # nucleus that closes inside them
        every = (tau == float("-inf")) | (use_min & (floor >= tau))
        known = tl.where(use_k, every | (n >= k),
                         every | (tl.sum(probs, 0) >= top_p * z))
        if not ((n <= CAP) & known & (m > float("-inf"))):
            flag = 1
    # NOTE: a row with no finite logit (a grammar that allows no token) has no winner; any id in
    # range lets the scheduler end it, where an index past the vocabulary would fault later
    token = tl.minimum(tl.maximum(token, 0), V - 1)
    tl.store(tokens_ptr + row, token.to(tl.int64))
    tl.store(flags_ptr + row, flag)
    if HAS_COUNTS:
        crow = tl.load(count_rows_ptr + row)
        if (crow >= 0) & (flag == 0):
            ptr = counts_ptr + crow.to(tl.int64) * V + token
            tl.store(ptr, tl.load(ptr) + 1)
