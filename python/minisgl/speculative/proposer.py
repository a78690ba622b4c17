"""The proposer interface: drafts for a step's requests, from whatever it knows.

A proposer sees a request's real tokens (prompt and accepted output), and keeps per-request state
keyed by uid, which it builds incrementally from ``req.input_ids``: tokens are only appended to a
live request's list between two calls (a retracted request may re-feed, never rewrite them).
Every TP rank runs the same proposer on the same tokens, so all ranks draft the same tokens.

The draft-head methods (MTP heads, EAGLE-3 drafts: ``head.py``) are fed besides the target's
hidden states of the positions each forward computed and kept (``record``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minisgl.core import Req


class Proposer(ABC):
    """Drafts for one method. Proposing must be cheap on the host: it runs for every
    speculating request every step, between two forwards."""

    name: str = ""
    lookahead: bool = False  # it drafts after tokens not yet accepted (``propose_ahead``)

    @abstractmethod
    def propose(self, req: Req, max_len: int) -> list[int]:
        """Up to ``max_len`` tokens likely to follow ``req.input_ids`` (maybe none)."""

    def propose_ahead(self, req: Req, tail: list[int], max_len: int) -> list[int]:
        """``propose`` as if ``tail`` (drafts still being verified) followed ``req.input_ids``;
        what the proposer keeps of the request is built from ``input_ids`` alone. Only for a
        ``lookahead`` proposer."""
        raise NotImplementedError(f"{self.name} drafts from accepted tokens only")

    def propose_many(self, reqs: list[Req], max_lens: list[int]) -> list[list[int]]:
        """``propose`` for a step's requests at once (a method with a draft model runs them as
        one batch)."""
        return [self.propose(req, n) for req, n in zip(reqs, max_lens)]

    def record(self, req: Req, start: int, rows: torch.Tensor) -> None:
        """The target's hidden rows of positions ``start .. start + len(rows) - 1`` of ``req``,
        computed and kept (only for the methods whose engine hands them back)."""

    def finished(self, req: Req, learn: bool = True) -> None:
        """``req`` ended (finished or aborted): drop its state; a method that learns across
        requests keeps what it wants of its tokens, if ``learn`` (False while the batch is too
        large to speculate: the host is then the bottleneck, and nothing drafts from it)."""

    def spare(self, budget: int | None) -> bool:
        """Host time to spare (a forward computing, the scheduler idle): do up to ``budget``
        units of deferred work (None: all of it); whether some is left."""
        return False
