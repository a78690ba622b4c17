"""Split-row sampling: the default Triton path; the one-program-per-row kernel
(``sampling.py``) finishes the rows this path cannot decide exactly.

    chunk kernel, grid (B, S)  one program per CHUNK columns of a row: scaled values x (penalties,
                               bias, bitmask, / T) in one read; chunk max and first argmax,
                               sum exp(x - max) when top_p needs the full normaliser, the raw
                               logits' max and sumexp (log-probs), the race winner of rows with
                               no filter, and the chunk's top C (value, lower id first) as int64
                               keys: the top C groups of GS columns by their max, then the top C
                               of those C * GS columns (re-read from L1/L2); with top log-probs
                               asked, the same for the top NT raw logits
    merge kernel, grid (B,)    global max / argmax / logsumexp / race winner / top NT raw logits
                               (the top log-probs, no torch.topk over the vocabulary); filtered
                               rows take the top KEEP of the S * C keys and run the reference's
                               sorted scan (min_p floor, top_k with ties, top_p nucleus over the
                               full vocabulary) and the race on them. The result is exact when the
                               kept set's last value b is above T = max(every chunk's C-th value,
                               the KEEP-th key) and the counts/masses the scan used are known
                               exactly; otherwise the row is flagged
    row kernel, grid (B,)      ``sampling._sample_kernel``: flagged rows only (the others return)

With C > top_k (32 > Qwen's 20) a top_k row is never flagged for lack of candidates (a chunk
cannot hold C tokens at or above the k-th value, ties aside). No host sync.
``MINISGL_SAMPLER=triton-row`` runs only the row kernel (ablation);
``MINISGL_SAMPLER=torch`` the torch reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl import env

from .sampling import CAND, _INTERPRET, _MAX_SEARCH, _PIVOTS, _log_e, _mix, _sample_kernel, _values

NSTAT = 5  # floats per chunk record: max, sumexp, race best, raw max, raw sumexp
# below this vocabulary the row kernel alone is faster (H100, 32,000 columns, B=1: 67 us against
# 127 us; 151,936 columns: 271 us against 147 us, and 661 against 304 at B=256)
SPLIT_MIN_VOCAB = 65536
TopLogits = tuple[torch.Tensor, torch.Tensor]  # ids int64 [B, n], raw logits float32 [B, n]
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
def _chunk_kernel(
    logits_ptr, V, temps_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seeds_ptr, steps_ptr, counts_ptr,
    count_rows_ptr, pres_ptr, freq_ptr, rep_ptr, bias_ptr, bias_rows_ptr, mask_ptr, W,
    stats_ptr, args_ptr, keys_ptr, raw_keys_ptr, S,
    HAS_COUNTS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr,
    NEED_LSE: tl.constexpr, LIBDEVICE: tl.constexpr, CHUNK: tl.constexpr, C: tl.constexpr,
    GS: tl.constexpr, NT: tl.constexpr,
):
    row = tl.program_id(0)
    s = tl.program_id(1)
    temp = tl.load(temps_ptr + row)
    t = tl.where(temp <= 0.0, 1.0, temp)
    k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    filtered = (temp > 0.0) & ((k < V) | (top_p < 1.0) | (min_p > 0.0))
    race_now = (temp > 0.0) & (k >= V) & (top_p >= 1.0) & (min_p <= 0.0)
    need_z = filtered & (k >= V) & (min_p <= 0.0)
    crow = tl.load(count_rows_ptr + row) if HAS_COUNTS else -1
    rep = tl.load(rep_ptr + row) if HAS_COUNTS else 1.0
    freq = tl.load(freq_ptr + row) if HAS_COUNTS else 0.0
    pres = tl.load(pres_ptr + row) if HAS_COUNTS else 0.0
    brow = tl.load(bias_rows_ptr + row) if HAS_BIAS else -1
    NG: tl.constexpr = CHUNK // GS
    start = s * CHUNK
    offs = start + tl.arange(0, NG)[:, None] * GS + tl.arange(0, GS)[None, :]
    mask = offs < V
    raw, x = _values(logits_ptr, row, offs, mask, V, t, counts_ptr, crow, rep, freq, pres,
                     bias_ptr, brow, mask_ptr, W, HAS_COUNTS, HAS_BIAS, HAS_MASK)
    m = tl.max(tl.max(x, 1), 0)
    arg = tl.min(tl.min(tl.where(x == m, offs, _BIG), 1), 0)
    z = 0.0
    if need_z & (m > float("-inf")):
        z = tl.sum(tl.sum(tl.exp(x - m), 1), 0)
    best = float("-inf")
    best_i = arg
    if race_now:
        seed = tl.load(seeds_ptr + row).to(tl.uint64, bitcast=True)
        step = tl.load(steps_ptr + row).to(tl.uint64, bitcast=True)
        row_state = _mix(_mix(seed + 0x9E3779B97F4A7C15) + (step + 1) * 0x9E3779B97F4A7C15)
        score = tl.where(x > float("-inf"), x - _log_e(row_state, offs, LIBDEVICE), float("-inf"))
        best = tl.max(tl.max(score, 1), 0)
        best_i = tl.min(tl.min(tl.where(score == best, offs, _BIG), 1), 0)
    raw_m = 0.0
    raw_s = 0.0
    if NEED_LSE:
        raw_m = tl.max(tl.max(raw, 1), 0)
        if raw_m > float("-inf"):
            raw_s = tl.sum(tl.sum(tl.exp(raw - raw_m), 1), 0)
    rec = row.to(tl.int64) * S + s
    if NT > 0:  # the chunk's top NT raw logits (top log-probs), found as the top C below
        rgid = 4294967295 - (tl.topk(_key(tl.max(raw, 1), tl.arange(0, NG)), NT) & 4294967295)
        roffs = start + rgid.to(tl.int32)[:, None] * GS + tl.arange(0, GS)[None, :]
        raw2 = tl.load(logits_ptr + row.to(tl.int64) * V + roffs, mask=roffs < V,
                       other=float("-inf")).to(tl.float32)
        rtop = tl.topk(tl.reshape(_key(raw2, roffs), [NT * GS]), NT)
        tl.store(raw_keys_ptr + rec * NT + tl.arange(0, NT), rtop)
    tl.store(stats_ptr + rec * 5, m)
    tl.store(stats_ptr + rec * 5 + 1, z)
    tl.store(stats_ptr + rec * 5 + 2, best)
    tl.store(stats_ptr + rec * 5 + 3, raw_m)
    tl.store(stats_ptr + rec * 5 + 4, raw_s)
    tl.store(args_ptr + rec * 2, arg)
    tl.store(args_ptr + rec * 2 + 1, best_i)
    if filtered:
        # the top C groups by their max hold the chunk's top C (ties: lower id first)
        gkey = _key(tl.max(x, 1), tl.arange(0, NG))
        gid = 4294967295 - (tl.topk(gkey, C) & 4294967295)
        offs2 = start + gid.to(tl.int32)[:, None] * GS + tl.arange(0, GS)[None, :]
        _, x2 = _values(logits_ptr, row, offs2, offs2 < V, V, t, counts_ptr, crow, rep, freq, pres,
                        bias_ptr, brow, mask_ptr, W, HAS_COUNTS, HAS_BIAS, HAS_MASK)
        top = tl.topk(tl.reshape(_key(x2, offs2), [C * GS]), C)
        tl.store(keys_ptr + rec * C + tl.arange(0, C), top)


@triton.jit
def _merge_kernel(
    V, tokens_ptr, lse_ptr, flags_ptr, temps_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seeds_ptr,
    steps_ptr, counts_ptr, count_rows_ptr, stats_ptr, args_ptr, keys_ptr, raw_keys_ptr,
    top_ids_ptr, top_vals_ptr, S,
    HAS_COUNTS: tl.constexpr, NEED_LSE: tl.constexpr, LIBDEVICE: tl.constexpr, C: tl.constexpr,
    S_PAD: tl.constexpr, KEEP: tl.constexpr, NT: tl.constexpr,
):
    row = tl.program_id(0)
    temp = tl.load(temps_ptr + row)
    k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    filtered = (temp > 0.0) & ((k < V) | (top_p < 1.0) | (min_p > 0.0))
    race_now = (temp > 0.0) & (k >= V) & (top_p >= 1.0) & (min_p <= 0.0)
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
    if NT > 0:  # every row's top NT raw logits: the top NT of the chunks' top NT
        ti = tl.arange(0, S_PAD * NT)
        rkeys = tl.load(raw_keys_ptr + row.to(tl.int64) * S * NT + ti, mask=ti < S * NT,
                        other=_I64_MIN)
        tv, tid = _unkey(tl.topk(rkeys, NT))
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
        z_s = tl.load(stats_ptr + rec * 5 + 1, mask=live, other=0.0)
        z = tl.sum(tl.where(m_s > float("-inf"), z_s * tl.exp(m_s - m), 0.0), 0)
        tau, _ = _unkey(tl.load(keys_ptr + rec * C + C - 1, mask=live, other=_I64_MIN))
        ki = tl.arange(0, S_PAD * C)
        keys = tl.load(keys_ptr + row.to(tl.int64) * S * C + ki, mask=ki < S * C, other=_I64_MIN)
        v, idx = _unkey(tl.topk(keys, KEEP))
        ci = tl.arange(0, KEEP)
        bound = tl.maximum(tl.max(tau, 0), tl.min(v, 0))  # T: every token above it is in v
        n_exact = tl.sum((v > bound).to(tl.int32), 0)
        use_k = k < V
        use_min = min_p > 0.0
        floor = tl.where(use_min, m + tl.log(min_p), float("-inf"))
        cnt_floor = tl.sum(((v >= floor) & (v > float("-inf"))).to(tl.int32), 0)
        n_keep = tl.where(use_k, tl.minimum(cnt_floor, k), cnt_floor)
        known = (use_k & (k <= n_exact)) | (floor > bound) | (bound == float("-inf"))
        known = known | ((k >= V) & (min_p <= 0.0))
        # the reference's sorted scan, on the candidates (probabilities over the whole vocabulary)
        probs = tl.where(ci < n_keep, tl.exp(v - m), 0.0)
        z_k = tl.where(use_k | use_min, tl.sum(probs, 0), z)
        before = tl.cumsum(probs, 0) - probs
        nucleus = tl.where(top_p >= 1.0, ci < n_keep, (before < top_p * z_k) & (ci < n_keep))
        n_final = tl.maximum(tl.sum(nucleus.to(tl.int32), 0), 1)
        b = tl.sum(tl.where(ci == n_final - 1, v, 0.0), 0)
        seed = tl.load(seeds_ptr + row).to(tl.uint64, bitcast=True)
        step = tl.load(steps_ptr + row).to(tl.uint64, bitcast=True)
        row_state = _mix(_mix(seed + 0x9E3779B97F4A7C15) + (step + 1) * 0x9E3779B97F4A7C15)
        score = tl.where(v >= b, v - _log_e(row_state, idx, LIBDEVICE), float("-inf"))
        best = tl.max(score, 0)
        token = tl.min(tl.where(score == best, idx, _BIG), 0)
        if not ((b > bound) & known & (m > float("-inf"))):
            flag = 1
    tl.store(tokens_ptr + row, token.to(tl.int64))
    tl.store(flags_ptr + row, flag)
    if HAS_COUNTS:
        crow = tl.load(count_rows_ptr + row)
        if (crow >= 0) & (flag == 0):
            ptr = counts_ptr + crow.to(tl.int64) * V + token
            tl.store(ptr, tl.load(ptr) + 1)


def pick_chunk(bsz: int, vocab: int) -> int:
    """Columns per chunk program: 4096 (fewer candidates to merge) once B * S fills 132 SMs four
    times over, else 2048. Either way 8 columns per thread (16 or 8 warps): at sm_90 that is 64
    registers (about 100 with penalties, bias, mask and log-probs), no spills."""
    return 4096 if bsz * triton.cdiv(vocab, 4096) >= 4 * 132 else 2048


def sample_rows(logits: torch.Tensor, temps: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, min_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
                counts: torch.Tensor | None = None, count_rows: torch.Tensor | None = None,
                penalties: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                bias: torch.Tensor | None = None, bias_rows: torch.Tensor | None = None,
                bitmask: torch.Tensor | None = None, need_lse: bool = False,
                block: int = 2048, cand: int = CAND, chunk: int | None = None, topc: int = 32,
                keep: int = 128, flags_out: torch.Tensor | None = None, path: str | None = None,
                top_n: int = 0, gs: int | None = None, warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, TopLogits | None]:
    """Sample one token per row of ``logits`` [B, V]: tokens int64 [B], the raw logsumexp [B]
    (``need_lse``) or None, and the top raw logits (below) or None. ``top_k`` is int32 with ``V``
    meaning off; ``count_rows``/``bias_rows`` give each row's counts/bias row or -1;
    ``penalties`` = (presence, frequency, repetition). ``block``/``cand`` size the row kernel,
    ``chunk``/``topc``/``keep``/``gs`` (columns per group)/``warps`` (of a chunk program) the split
    path (powers of two; ``chunk`` None: from B and V, and the row kernel alone below
    ``SPLIT_MIN_VOCAB``). ``flags_out`` (int32 [B]) receives 1 for
    the rows the row kernel finished. ``path`` "triton-row" (default: ``MINISGL_SAMPLER``) skips
    the split path. ``top_n`` > 0 (at most ``topc``): the split path also returns each row's
    ``top_n`` largest raw logits (ids int64 and values float32 [B, top_n], descending, lower id
    first on ties), for top log-probs without another pass; None where the split path did not
    run."""
    assert logits.is_contiguous()
    bsz, vocab = logits.shape
    device = logits.device
    tokens = torch.empty(bsz, dtype=torch.int64, device=device)
    lse = torch.empty(bsz, dtype=torch.float32, device=device) if need_lse else tokens
    dummy = temps
    pres, freq, rep = penalties if penalties is not None else (dummy, dummy, dummy)
    count_args = (counts if counts is not None else dummy,
                  count_rows if count_rows is not None else steps)
    feats = dict(HAS_COUNTS=counts is not None, HAS_BIAS=bias is not None,
                 HAS_MASK=bitmask is not None, NEED_LSE=need_lse, LIBDEVICE=not _INTERPRET)
    rest = (pres, freq, rep, bias if bias is not None else dummy,
            bias_rows if bias_rows is not None else steps,
            bitmask if bitmask is not None else dummy,
            bitmask.shape[1] if bitmask is not None else 0)
    split = (path or env.SAMPLER.get()) != "triton-row" and (chunk is not None
                                                              or vocab >= SPLIT_MIN_VOCAB)
    flags = tokens  # unused by the row kernel alone
    if split:
        chunk = chunk or pick_chunk(bsz, vocab)
        n_chunks = triton.cdiv(vocab, chunk)
        s_pad = triton.next_power_of_2(n_chunks)
        stats = torch.empty(bsz, n_chunks, NSTAT, dtype=torch.float32, device=device)
        args = torch.empty(bsz, n_chunks, 2, dtype=torch.int32, device=device)
        keys = torch.empty(bsz, n_chunks, topc, dtype=torch.int64, device=device)
        nt = triton.next_power_of_2(max(top_n, 2)) if top_n > 0 else 0
        assert nt <= topc, f"top_n {top_n} above the candidates per chunk ({topc})"
        raw_keys = torch.empty(bsz, n_chunks, max(nt, 1), dtype=torch.int64, device=device)
        top_ids = torch.empty(bsz, max(nt, 1), dtype=torch.int64, device=device)
        top_vals = torch.empty(bsz, max(nt, 1), dtype=torch.float32, device=device)
        flags = flags_out if flags_out is not None else torch.empty(bsz, dtype=torch.int32,
                                                                    device=device)
        _chunk_kernel[(bsz, n_chunks)](
            logits, vocab, temps, top_k, top_p, min_p, seeds, steps, *count_args, *rest,
            stats, args, keys, raw_keys, n_chunks, **feats, CHUNK=chunk, C=topc,
            GS=gs or max(1, min(16, chunk // topc)), NT=nt,
            num_warps=warps or min(16, max(4, chunk // 256)),
        )
        _merge_kernel[(bsz,)](
            vocab, tokens, lse, flags, temps, top_k, top_p, min_p, seeds, steps, *count_args,
            stats, args, keys, raw_keys, top_ids, top_vals, n_chunks,
            HAS_COUNTS=feats["HAS_COUNTS"], NEED_LSE=need_lse, LIBDEVICE=feats["LIBDEVICE"],
            C=topc, S_PAD=s_pad, KEEP=min(keep, s_pad * topc), NT=nt, num_warps=4,
        )
    scratch = torch.empty(bsz, cand, dtype=torch.int64, device=device)
    _sample_kernel[(bsz,)](
        logits, vocab, tokens, lse, temps, top_k, top_p, min_p, seeds, steps, *count_args, *rest,
        scratch, flags, **feats, USE_FLAGS=split, BLOCK=block, CAND=cand, P=_PIVOTS,
        MAX_SEARCH=_MAX_SEARCH, num_warps=8,
    )
    top = (top_ids[:, :top_n], top_vals[:, :top_n]) if split and top_n > 0 else None
    return tokens, (lse if need_lse else None), top
