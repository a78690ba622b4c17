"""N-gram prompt lookup (vLLM's ``ngram`` method): find the request's last n tokens earlier in its
own prompt and output, and propose what followed them there.

n goes from ``prompt_lookup_max`` down to ``prompt_lookup_min``; the first n with an earlier
occurrence wins (a longer match predicts better), and of its occurrences the most recent one (in
an edit the text being copied is the latest occurrence). The search is vectorised over a numpy
copy of the tokens that grows with the request.
"""

from __future__ import annotations

import numpy as np

from minisgl.core import Req

from .proposer import Proposer


class TokenHistory:
    """A request's tokens as a growing int64 array (amortised doubling); tokens are only ever
    appended, so a sync copies the new ones. A ``tail`` (drafts not yet accepted) is written
    past them and not counted: the next sync overwrites it."""

    def __init__(self) -> None:
        self.buf = np.zeros(256, dtype=np.int64)
        self.len = 0

    def sync(self, ids: list[int], tail: list[int] | None = None) -> np.ndarray:
        n = len(ids)
        start = min(self.len, n)
        end = n + len(tail) if tail else n
        if end > len(self.buf):
            grown = np.zeros(max(end, 2 * len(self.buf)), dtype=np.int64)
            grown[:start] = self.buf[:start]
            self.buf = grown
        self.buf[start:n] = ids[start:]
        if tail:
            self.buf[n:end] = tail
        self.len = n
        return self.buf[:end]


def lookup(tokens: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix
    n-gram (``n_min <= n <= n_max``) of ``tokens``."""
    total = len(tokens)
    if total < n_min + 1 or k <= 0:
        return []
    # candidate ends: earlier positions holding the last token (the suffix itself excluded)
    ends = np.flatnonzero(tokens[: total - 1] == tokens[-1])
    for n in range(min(n_max, total - 1), n_min - 1, -1):
        ok = ends[ends >= n - 1]
        for back in range(1, n):
            if not len(ok):
                break
            ok = ok[tokens[ok - back] == tokens[total - 1 - back]]
        if len(ok):
            start = int(ok[-1]) + 1
            return tokens[start : start + k].tolist()
    return []


class NgramProposer(Proposer):
    name = "ngram"
    lookahead = True

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.history: dict[int, TokenHistory] = {}

    def propose(self, req: Req, max_len: int) -> list[int]:
        tokens = self.history.setdefault(req.uid, TokenHistory()).sync(req.input_ids)
        return lookup(tokens, self.n_min, self.n_max, max_len)

    def propose_ahead(self, req: Req, tail: list[int], max_len: int) -> list[int]:
        tokens = self.history.setdefault(req.uid, TokenHistory()).sync(req.input_ids, tail)
        return lookup(tokens, self.n_min, self.n_max, max_len)

    def finished(self, req: Req, learn: bool = True) -> None:
        self.history.pop(req.uid, None)
