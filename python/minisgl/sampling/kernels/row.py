"""One Triton program per row: penalties, logit_bias, grammar mask, temperature, min_p, top_k, top_p
and the draw, with no sort of the vocabulary.

The semantics are those of the torch reference (``sampling/torch_ref.py``): the kept set is every
token whose scaled logit is >= a per-row threshold ``t*`` (ties kept), and the token is the winner
of the exponential race ``argmax(x - log E)`` over it, with ``E`` from the same counter-based hash
of (seed, step, index). Finding ``t*`` without sorting the vocabulary::

    pass 1     max m, first argmax, smallest finite value, sum exp(x - m) (online), raw logsumexp
    search     count and mass of x >= v at P+1 pivots v between lo and hi; keep the bracket around
               the point where the top_k count / top_p mass is reached (usually one pass)
    gather     the tokens of the bracket (at most CAND) into a scratch row, sorted in registers;
               the threshold is read off exactly as the reference's sorted scan would
    race       over the gathered candidates when they hold every kept token, else one more pass

By default the split-row path (``split.py``) runs first and this kernel finishes only the rows it
flags; the ``triton-row`` sampler runs it alone. Rows without filters race in pass 1; greedy rows
take pass 1's argmax. Each sampled token of a penalised row is added to its counts row at the end
(see ``sampling/state.py``).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
CAND = 1024  # tokens one row may gather; a top_k above it goes to the torch path
PIVOTS = 8  # points per search pass (a power of two), lo and hi included
MAX_SEARCH = 12  # search passes at most (one usually brackets few enough tokens)
_COUNT_MASK = (1 << 30) - 1


@triton.jit
def _mix(z):
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def log_e(row_state, idx, LIBDEVICE: tl.constexpr):
    """log of the exponential variate of token ``idx`` (``random_uniform`` of the reference)."""
    h = _mix((idx + 1).to(tl.uint64) * 0x9E3779B97F4A7C15 + row_state)
    u = (
        (h >> 1).to(tl.int64, bitcast=True).to(tl.float32) * 1.0842021724855044e-19
        + 5.421010862427522e-20
    )
    u = tl.minimum(u, 0.9999999403953552)
    if LIBDEVICE:
        e = -tl.extra.cuda.libdevice.log1p(-u)
    else:  # the interpreter has no libdevice: a series where 1 - u would round
        e = tl.where(u < 0.0009765625, u + 0.5 * u * u + u * u * u / 3.0, -tl.log(1.0 - u))
    return tl.log(e)


@triton.jit
def draw_state(seeds_ptr, steps_ptr, row):
    """The hash state of a row's draw at this step: (seed, step) mixed (``random_uniform``)."""
    seed = tl.load(seeds_ptr + row).to(tl.uint64, bitcast=True)
    step = tl.load(steps_ptr + row).to(tl.uint64, bitcast=True)
    return _mix(_mix(seed + 0x9E3779B97F4A7C15) + (step + 1) * 0x9E3779B97F4A7C15)


@triton.jit
def row_adjust(count_rows_ptr, rep_ptr, freq_ptr, pres_ptr, bias_rows_ptr, row,
               HAS_COUNTS: tl.constexpr, HAS_BIAS: tl.constexpr):
    """A row's counts row (-1: none), repetition / frequency / presence penalties and bias row,
    as ``tile_values`` takes them."""
    crow = tl.load(count_rows_ptr + row) if HAS_COUNTS else -1
    rep = tl.load(rep_ptr + row) if HAS_COUNTS else 1.0
    freq = tl.load(freq_ptr + row) if HAS_COUNTS else 0.0
    pres = tl.load(pres_ptr + row) if HAS_COUNTS else 0.0
    brow = tl.load(bias_rows_ptr + row) if HAS_BIAS else -1
    return crow, rep, freq, pres, brow


@triton.jit
def tile_values(logits_ptr, row, offs, mask, V, t, counts_ptr, crow, rep, freq, pres, bias_ptr,
                brow, mask_ptr, W, HAS_COUNTS: tl.constexpr, HAS_BIAS: tl.constexpr,
                HAS_MASK: tl.constexpr):
    """Raw and scaled (penalised, biased, masked, / temperature) logits of one tile."""
    raw = tl.load(logits_ptr + row.to(tl.int64) * V + offs, mask=mask, other=float("-inf"))
    raw = raw.to(tl.float32)
    x = raw
    if HAS_COUNTS:
        if crow >= 0:
            c = tl.load(counts_ptr + crow.to(tl.int64) * V + offs, mask=mask, other=0)
            x = tl.where(c != 0, tl.where(x > 0, x / rep, x * rep), x)
            n = (c & 1073741823).to(tl.float32)
            x = x - freq * n - pres * (n > 0).to(tl.float32)
    if HAS_BIAS:
        if brow >= 0:
            x = x + tl.load(bias_ptr + brow.to(tl.int64) * V + offs, mask=mask, other=0.0)
    if HAS_MASK:
        words = tl.load(mask_ptr + row.to(tl.int64) * W + offs // 32, mask=mask, other=0)
        x = tl.where(((words >> (offs % 32)) & 1) != 0, x, float("-inf"))
    return raw, x / t


@triton.jit
def sample_kernel(
    logits_ptr, V, tokens_ptr, lse_ptr, temps_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seeds_ptr,
    steps_ptr, counts_ptr, count_rows_ptr, pres_ptr, freq_ptr, rep_ptr, bias_ptr, bias_rows_ptr,
    mask_ptr, W, scratch_ptr, flags_ptr,
    HAS_COUNTS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    NEED_LSE: tl.constexpr, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr, CAND: tl.constexpr,
    P: tl.constexpr, MAX_SEARCH: tl.constexpr, USE_FLAGS: tl.constexpr,
):
    row = tl.program_id(0)
    if USE_FLAGS:  # after the split path (split.py): only the rows it flagged
        if tl.load(flags_ptr + row) == 0:
            return
    temp = tl.load(temps_ptr + row)
    greedy = temp <= 0.0
    t = tl.where(greedy, 1.0, temp)
    k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    filtered = (k < V) | (top_p < 1.0) | (min_p > 0.0)
    race_now = (temp > 0.0) & (k >= V) & (top_p >= 1.0) & (min_p <= 0.0)
    crow, rep, freq, pres, brow = row_adjust(count_rows_ptr, rep_ptr, freq_ptr, pres_ptr,
                                             bias_rows_ptr, row, HAS_COUNTS, HAS_BIAS)
    row_state = draw_state(seeds_ptr, steps_ptr, row)
    base = tl.arange(0, BLOCK)

    # ---- pass 1 ----
    m = float("-inf")
    arg = 0
    low = float("inf")
    z = 0.0
    best = float("-inf")
    best_i = 0
    raw_m = float("-inf")
    raw_s = 0.0
    for start in range(0, V, BLOCK):
        offs = start + base
        mask = offs < V
        raw, x = tile_values(logits_ptr, row, offs, mask, V, t, counts_ptr, crow, rep, freq, pres,
                             bias_ptr, brow, mask_ptr, W, HAS_COUNTS, HAS_BIAS, HAS_MASK)
        tile_m = tl.max(x, 0)
        if tile_m > m:
            arg = start + tl.argmax(x, 0)
        if filtered:
            new_m = tl.maximum(m, tile_m)
            if new_m > float("-inf"):
                z = z * tl.exp(m - new_m) + tl.sum(tl.exp(x - new_m), 0)
            low = tl.minimum(low, tl.min(tl.where(x > float("-inf"), x, float("inf")), 0))
        m = tl.maximum(m, tile_m)
        if race_now:
            score = tl.where(x > float("-inf"), x - log_e(row_state, offs, LIBDEVICE),
                             float("-inf"))
            tile_best = tl.max(score, 0)
            if tile_best > best:
                best = tile_best
                best_i = start + tl.argmax(score, 0)
        if NEED_LSE:
            new_rm = tl.maximum(raw_m, tl.max(raw, 0))
            raw_s = raw_s * tl.exp(raw_m - new_rm) + tl.sum(tl.exp(raw - new_rm), 0)
            raw_m = new_rm
    token = arg
    if race_now:
        token = best_i
    if NEED_LSE:
        tl.store(lse_ptr + row, raw_m + tl.log(raw_s))

    if filtered & (temp > 0.0):
        floor = tl.where(min_p > 0.0, m + tl.log(min_p), float("-inf"))
        lo0 = tl.maximum(floor, low)
        use_k = k < V
        threshold = floor
        if use_k | (top_p < 1.0):
            # ---- search: lo satisfies the requirement, hi (if below +inf) does not ----
            lo = lo0
            hi = m
            cnt_hi = 0
            mass_hi = 0.0
            z_alive = z
            done = 0
            gather_hi = float("inf")
            # pivots at these fractions of [lo, hi]: even below, denser towards the top
            jj = tl.arange(0, P)
            frac = tl.where(jj <= 3, jj.to(tl.float32) * 0.25,
                            1.0 - tl.exp2(-(jj - 1).to(tl.float32)))
            frac = tl.where(jj == P - 1, 1.0, frac)
            for _search in range(MAX_SEARCH):
                if done == 0:
                    piv = lo + (hi - lo) * frac  # piv[0] = lo ... piv[P - 1] = hi
                    cnt = tl.zeros([P], dtype=tl.int32)
                    mass = tl.zeros([P], dtype=tl.float32)
                    z_live = 0.0
                    for start in range(0, V, BLOCK):
                        offs = start + base
                        mask = offs < V
                        _, x = tile_values(logits_ptr, row, offs, mask, V, t, counts_ptr, crow, rep,
                                           freq, pres, bias_ptr, brow, mask_ptr, W, HAS_COUNTS,
                                           HAS_BIAS, HAS_MASK)
                        ge = x[:, None] >= piv[None, :]
                        cnt += tl.sum(ge.to(tl.int32), 0)
                        if k >= V:
                            e = tl.exp(x - m)
                            mass += tl.sum(tl.where(ge, e[:, None], 0.0), 0)
                            z_live += tl.sum(tl.where(x >= floor, e, 0.0), 0)
                    if k >= V:
                        z_alive = z_live
                    ok = (piv <= lo0) | tl.where(use_k, cnt >= k, mass >= top_p * z_alive)
                    j = tl.max(tl.where(ok, jj, 0), 0)
                    sel = jj == j
                    nxt = jj == j + 1
                    cnt_j = tl.sum(tl.where(sel, cnt, 0), 0)
                    lo = tl.sum(tl.where(sel, piv, 0.0), 0)
                    if cnt_j <= CAND:
                        done = 1
                        gather_hi = float("inf")
                        cnt_hi = 0
                        mass_hi = 0.0
                    elif j < P - 1:
                        hi = tl.sum(tl.where(nxt, piv, 0.0), 0)
                        cnt_hi = tl.sum(tl.where(nxt, cnt, 0), 0)
                        mass_hi = tl.sum(tl.where(nxt, mass, 0.0), 0)
                        if cnt_j - cnt_hi <= CAND:
                            done = 1
                            gather_hi = hi
            threshold = lo  # if the search did not converge: keep a little more than asked
            if done != 0:
                # ---- gather the bracket [lo, gather_hi) into the scratch row ----
                n = 0
                for start in range(0, V, BLOCK):
                    offs = start + base
                    mask = offs < V
                    _, x = tile_values(logits_ptr, row, offs, mask, V, t, counts_ptr, crow, rep,
                                       freq, pres, bias_ptr, brow, mask_ptr, W, HAS_COUNTS,
                                       HAS_BIAS, HAS_MASK)
                    take = mask & (x >= lo) & (x < gather_hi)
                    pos = n + tl.cumsum(take.to(tl.int32), 0) - 1
                    bits = x.to(tl.int32, bitcast=True)
                    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64)
                    key = (key << 32) + (4294967295 - offs.to(tl.int64))  # ties: lower id first
                    tl.store(scratch_ptr + row.to(tl.int64) * CAND + pos, key,
                             mask=take & (pos < CAND))
                    n += tl.sum(take.to(tl.int32), 0)
                n = tl.minimum(n, CAND)
                tl.debug_barrier()
                ci = tl.arange(0, CAND)
                valid = ci < n
                keys = tl.load(scratch_ptr + row.to(tl.int64) * CAND + ci, mask=valid,
                               other=-9223372036854775808)
                keys = tl.sort(keys, descending=True)
                kb = keys >> 32
                idx = (4294967295 - (keys - (kb << 32))).to(tl.int32)
                kb = kb.to(tl.int32)
                v = (kb ^ ((kb >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
                v = tl.where(valid, v, float("-inf"))
                # ---- the reference's sorted scan, on the candidates ----
                n_keep = tl.where(use_k, tl.minimum(n, k - cnt_hi), n)
                probs = tl.where(ci < n_keep, tl.exp(v - m), 0.0)
                z_k = tl.where(use_k, mass_hi + tl.sum(probs, 0), z_alive)
                before = mass_hi + tl.cumsum(probs, 0) - probs
                nucleus = tl.where(top_p >= 1.0, ci < n_keep,
                                   (before < top_p * z_k) & (ci < n_keep))
                n_final = tl.maximum(tl.sum(nucleus.to(tl.int32), 0), 1)
                threshold = tl.sum(tl.where(ci == n_final - 1, v, 0.0), 0)
                if gather_hi == float("inf"):
                    score = tl.where(valid & (v >= threshold),
                                     v - log_e(row_state, idx, LIBDEVICE), float("-inf"))
                    token = tl.sum(tl.where(ci == tl.argmax(score, 0), idx, 0), 0)
                    threshold = float("nan")  # raced already
        if threshold == threshold:  # not NaN: race over x >= threshold in one more pass
            best = float("-inf")
            for start in range(0, V, BLOCK):
                offs = start + base
                mask = offs < V
                _, x = tile_values(logits_ptr, row, offs, mask, V, t, counts_ptr, crow, rep, freq,
                                   pres, bias_ptr, brow, mask_ptr, W, HAS_COUNTS, HAS_BIAS,
                                   HAS_MASK)
                keep = mask & (x >= threshold)
                if tl.max(keep.to(tl.int32), 0) > 0:
                    score = tl.where(keep, x - log_e(row_state, offs, LIBDEVICE), float("-inf"))
                    tile_best = tl.max(score, 0)
                    if tile_best > best:
                        best = tile_best
                        token = start + tl.argmax(score, 0)
    # NOTE: a row with no finite logit (a grammar that allows no token) has no winner; any id in
    # range lets the scheduler end it, where an index past the vocabulary would fault later
    token = tl.minimum(tl.maximum(token, 0), V - 1)
    tl.store(tokens_ptr + row, token.to(tl.int64))
    if HAS_COUNTS:
        if crow >= 0:
            ptr = counts_ptr + crow.to(tl.int64) * V + token
            tl.store(ptr, tl.load(ptr) + 1)
