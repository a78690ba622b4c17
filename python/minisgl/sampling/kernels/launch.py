"""Launching the Triton sampler: the split-row kernels of ``split.py``, then the row kernel of
``row.py`` for the rows they flag (or alone: small vocabularies, and ``row_only``).
"""

from __future__ import annotations

import torch
import triton

from .row import CAND, INTERPRET, MAX_SEARCH, PIVOTS, sample_kernel
from .split import GUESS, NSTAT, collect_kernel, merge_kernel, stats_kernel, threshold_kernel

# below this vocabulary the row kernel alone is faster (docs/performance.md)
SPLIT_MIN_VOCAB = 65536
TopLogits = tuple[torch.Tensor, torch.Tensor]  # ids int64 [B, n], raw logits float32 [B, n]


# columns per chunk program: 2048 re-reads twice the columns around the threshold
# (docs/performance.md)
CHUNK = 1024


def sample_rows(logits: torch.Tensor, temps: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, min_p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor,
                counts: torch.Tensor | None = None, count_rows: torch.Tensor | None = None,
                penalties: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                bias: torch.Tensor | None = None, bias_rows: torch.Tensor | None = None,
                bitmask: torch.Tensor | None = None, need_lse: bool = False,
                block: int = 2048, cand: int = CAND, chunk: int | None = None, cap: int = 256,
                warps: int = 4, cpp: int = 8, flags_out: torch.Tensor | None = None,
                row_only: bool = False,
                top_n: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, TopLogits | None]:
    """Sample one token per row of ``logits`` [B, V]: tokens int64 [B], the raw logsumexp [B]
    (``need_lse``) or None, and the top raw logits (below) or None. ``top_k`` is int32 with ``V``
    meaning off; ``count_rows``/``bias_rows`` give each row's counts/bias row or -1;
    ``penalties`` = (presence, frequency, repetition). ``block``/``cand`` size the row kernel,
    ``chunk`` (columns per program; None: ``CHUNK``, and the row kernel alone below
    ``SPLIT_MIN_VOCAB``), ``cap`` (candidates per row), ``warps`` and ``cpp`` (chunks per collect
    program) the split path (powers of two). ``flags_out`` (int32 [B]) receives 1 for the rows the
    row kernel finished. ``row_only`` skips the split path (the ``triton-row`` sampler).
    ``top_n`` > 0 (at most 32, with ``need_lse``): the split path also returns each row's
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
                 HAS_MASK=bitmask is not None)
    rest = (pres, freq, rep, bias if bias is not None else dummy,
            bias_rows if bias_rows is not None else steps,
            bitmask if bitmask is not None else dummy,
            bitmask.shape[1] if bitmask is not None else 0)
    split = not row_only and (chunk is not None or vocab >= SPLIT_MIN_VOCAB)
    flags = tokens  # unused by the row kernel alone
    if split:
        chunk = chunk or CHUNK
        n_chunks = triton.cdiv(vocab, chunk)
        # two sizes of the top-n merge (each a compiled variant): 8 and 32 candidates
        nt = (8 if top_n <= 8 else 32) if top_n > 0 else 0
        assert top_n <= 32 and (need_lse or nt == 0), f"top_n {top_n}: at most 32, with need_lse"
        stats = torch.empty(bsz, n_chunks, NSTAT, dtype=torch.float32, device=device)
        args = torch.empty(bsz, n_chunks, 2, dtype=torch.int32, device=device)
        cnt = torch.empty(bsz, 2, dtype=torch.int32, device=device)  # zeroed by the stats kernel
        cands = torch.empty(2 if nt else 1, bsz, cap, dtype=torch.int64, device=device)
        tau = torch.empty(bsz, 2, dtype=torch.float32, device=device)
        top_ids = torch.empty(bsz, max(nt, 1), dtype=torch.int64, device=device)
        top_vals = torch.empty(bsz, max(nt, 1), dtype=torch.float32, device=device)
        flags = flags_out if flags_out is not None else torch.empty(bsz, dtype=torch.int32,
                                                                    device=device)
        s_pad = triton.next_power_of_2(n_chunks)
        stats_kernel[(bsz, n_chunks)](
            logits, vocab, temps, top_k, top_p, min_p, seeds, steps, *count_args, *rest,
            stats, args, cnt, n_chunks, **feats, NEED_LSE=need_lse, LIBDEVICE=not INTERPRET,
            CHUNK=chunk, num_warps=warps,
        )
        threshold_kernel[(bsz,)](
            vocab, temps, top_k, top_p, min_p, stats, tau, n_chunks, top_n, S_PAD=s_pad,
            GUESS=GUESS, NT=nt, num_warps=4,
        )
        collect_kernel[(bsz, triton.cdiv(n_chunks, cpp))](
            logits, vocab, temps, *count_args, *rest, stats, cnt, cands[0], cands[-1], tau,
            n_chunks, **feats, CHUNK=chunk, CAP=cap, NT=nt, CPP=cpp, num_warps=warps,
        )
        merge_kernel[(bsz,)](
            logits, vocab, tokens, lse, flags, temps, top_k, top_p, min_p, seeds, steps,
            *count_args, stats, args, cnt, cands[0], cands[-1], tau, top_ids, top_vals, n_chunks,
            top_n, HAS_COUNTS=feats["HAS_COUNTS"], NEED_LSE=need_lse, LIBDEVICE=not INTERPRET,
            S_PAD=s_pad, CAP=cap, NT=nt, RB=min(1024, triton.next_power_of_2(vocab)), num_warps=4,
        )
    scratch = torch.empty(bsz, cand, dtype=torch.int64, device=device)
    sample_kernel[(bsz,)](
        logits, vocab, tokens, lse, temps, top_k, top_p, min_p, seeds, steps, *count_args, *rest,
        scratch, flags, **feats, NEED_LSE=need_lse, LIBDEVICE=not INTERPRET, USE_FLAGS=split,
        BLOCK=block, CAND=cand, P=PIVOTS, MAX_SEARCH=MAX_SEARCH, num_warps=8,
    )
    top = (top_ids[:, :top_n], top_vals[:, :top_n]) if split and top_n > 0 else None
    return tokens, (lse if need_lse else None), top
