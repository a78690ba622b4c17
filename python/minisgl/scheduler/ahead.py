"""Drafting ahead: the step after a verify step in flight, planned as if it kept all its drafts.

A step that drafts needs every request's last token on the host, so it would read the forward in
flight back first and leave the device idle while the host drafts, plans and launches. When that
forward is a verify step, the host knows what it fed; if every draft is accepted, the request's
next positions are those after the feed, and the token the next step feeds first (the target's
token after the last draft) is one the device writes into the token pool itself. So the next
step is drafted on the feed's drafts (``SpecDecoder.draft_ahead``) and launched before the one in
flight is read back::

    in flight:  ... last | d1 .. dk                 positions n-1 .. n+k-1, sampled x0 .. xk
    ahead:                          xk | e1 .. ej   positions n+k .. n+k+j (xk from the pool)

When the step in flight is read back, a request that rejected one of its drafts (or ended) is
dropped from the step drafted ahead (``StepPlan.dropped``): its commit gave back the pages past
its kept tokens, those of the dropped feed among them, and what the dropped rows compute is
ignored. The device may still write their K/V and tokens into those pages and the pool, but in
stream order, before any later forward that writes there first and then reads. A request whose
feed was dropped is known exactly to the host, so a step made of such feeds alone (``settled``)
needs no read-back before the next is planned.

Only steps of verify feeds alone, laid out as one-token decode rows (the first row of each feed
reads its token from the pool), with nothing waiting for a prefill, no retraction needed, and a
proposer that drafts after unaccepted tokens (``Proposer.lookahead``).
"""

from __future__ import annotations

from typing import Callable

from minisgl.core import Feed, Req
from minisgl.speculative import DraftBudget, SpecDecoder

from .cache import CacheCoordinator
from .decode import DecodeManager
from .plan import StepPlan
from .prefill import PrefillManager


class AheadPlanner:
    """``budget``: the step's token budget; ``rows_fit(n)``: whether ``n`` rows run as decode
    rows (``StepPlan.build``). The speculative decoder is the scheduler's, passed in each call
    (the scheduler's ``spec`` may be swapped between runs, as the benchmarks do)."""

    def __init__(self, prefill: PrefillManager, decode: DecodeManager, cache: CacheCoordinator,
                 budget: int, rows_fit: Callable[[int], bool]) -> None:
        self.prefill, self.decode, self.cache = prefill, decode, cache
        self.budget, self.rows_fit = budget, rows_fit

    def may_follow(self, plan: StepPlan, spec: SpecDecoder | None) -> bool:
        """Whether a step may be drafted ahead on ``plan`` once it is launched (else it is read
        back at once, as a step that drafts would read it first)."""
        return (spec is not None and spec.proposer.lookahead and bool(plan.verify)
                and not plan.decode and not plan.prefill and plan.batch.is_decode
                and not len(self.prefill))

    def plan(self, prev: StepPlan, spec: SpecDecoder | None) -> StepPlan | None:
        """The step after ``prev`` (in flight), drafted as if each of its verify feeds kept all
        its drafts; None where it cannot be (read ``prev`` back and plan as usual)."""
        feeds = prev.verify
        if (spec is None or prev.dropped or not self.may_follow(prev, spec)
                or {id(f.req) for f in feeds} != set(map(id, self.decode.running))):
            return None
        drafts = spec.draft_ahead(feeds, DraftBudget(self.budget - len(feeds)))
        if drafts is None:
            return None
        ahead = [Feed(f.req, f.device_len, f.device_len + 1 + len(d), len(d) + 1, d)
                 for f, d in zip(feeds, drafts)]
        needed = sum(self.cache.tokens_needed(f.req, f.device_len) for f in ahead)
        if needed > self.cache.available_tokens or not self.rows_fit(
                sum(f.samples for f in ahead)):
            return None
        self.cache.allocate_many([f.req for f in ahead], [f.device_len for f in ahead])
        plan = StepPlan.build([], ahead, [], self.rows_fit)
        assert plan is not None
        plan.follows = {f.uid: f for f in feeds}
        spec.stats.ahead_feeds += len(ahead)
        return plan

    def drop_rejected(self, prev: StepPlan, successor: StepPlan | None, live: dict[int, Req],
                      spec: SpecDecoder | None) -> None:
        """``prev`` was read back (``live``: the requests still known, by uid): drop from
        ``successor`` (drafted ahead on it) each request whose feed in ``prev`` kept less than
        all of it, or that ended."""
        if successor is None or not successor.follows:
            return
        for feed in prev.verify:
            if successor.follows.get(feed.uid) is feed and (
                    live.get(feed.uid) is not feed.req or feed.req.device_len != feed.device_len):
                successor.dropped.add(feed.uid)
                if spec is not None:
                    spec.stats.ahead_dropped += 1
