"""The proposer interface: k draft tokens per request per step, from whatever it knows.

A proposer sees a request's real tokens (prompt and accepted output), and keeps per-request state
keyed by uid, which it builds incrementally from ``req.input_ids``. Tokens are only appended to a
live request's list between two calls, except for a ``lookahead`` proposer: it may be shown the
drafts of a verify step in flight, and the next call may find the last few of them replaced.
Every TP rank runs the same proposer on the same tokens, so all ranks draft the same tokens.

The draft-head methods (MTP heads, EAGLE-3 drafts: ``head.py``) implement the same ``propose``,
fed besides by the target's hidden states (``record``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from minisgl.core import Req


class Proposer(ABC):
    """Drafts for one method. ``propose`` must be cheap on the host: it runs for every
    speculating request every step, between two forwards."""

    name: str = ""
    # whether ``propose`` may be given ``input_ids`` that end with a verify step's drafts, not yet
    # verified (``SpecDecoder.add_drafts``'s ``ahead``): a proposer that learns from what it
    # sees (a draft head fed the target's hidden states) cannot
    lookahead: bool = False

    @abstractmethod
    def propose(self, req: Req, max_len: int) -> list[int]:
        """Up to ``max_len`` tokens likely to follow ``req.input_ids`` (maybe none)."""

    def finished(self, req: Req, learn: bool = True) -> None:
        """``req`` ended (finished or aborted): drop its state; a method that learns across
        requests keeps what it wants of its tokens, if ``learn`` (False while the batch is too
        large to speculate: the host is then the bottleneck, and nothing drafts from it)."""

    def spare(self, budget: int | None) -> bool:
        """Host time to spare (a forward computing, the scheduler idle): do up to ``budget``
        units of deferred work (None: all of it); whether some is left."""
        return False
