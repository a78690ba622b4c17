"""Which requests the next forward runs: decode feeds, verify feeds (drafts), prefill chunks.

``mixed`` (the default): every running request's decode feed (a verify feed, with its drafts,
when this step speculates), then prefill chunks under the step's token budget. ``prefill-first``
(an ablation): a prefill step whenever one can be made, else the decode step.
"""

from __future__ import annotations

from typing import Callable

from minisgl.core import Feed
from minisgl.speculative import DraftBudget, SpecDecoder

from .cache import CacheCoordinator
from .config import SchedulerConfig
from .decode import DecodeManager
from .plan import StepPlan
from .prefill import PrefillManager


class BatchPlanner:
    """``retractions()``: how many retractions so far (the scheduler counts); ``rows_fit(n)``:
    whether a verify step of ``n`` rows runs as decode rows (``StepPlan.build``)."""

    def __init__(self, config: SchedulerConfig, prefill: PrefillManager, decode: DecodeManager,
                 cache: CacheCoordinator, retractions: Callable[[], int],
                 rows_fit: Callable[[int], bool]) -> None:
        self.config, self.prefill, self.decode, self.cache = config, prefill, decode, cache
        self.retractions, self.rows_fit = retractions, rows_fit

    def plan(self, drafter: SpecDecoder | None = None) -> StepPlan | None:
        """The next step's plan (None: nothing to run); ``drafter``: the speculation that drafts
        for this step, if it drafts."""
        if not self.config.mixed:
            prefill = self.prefill.schedule(decode_reserve=self.decode.tokens_needed())
            if prefill:
                return StepPlan.build([], [], prefill, self.rows_fit)
            decode, verify = self._decode(drafter, self.config.max_prefill_tokens)
            return StepPlan.build(decode, verify, [], self.rows_fit)
        return self._mixed(drafter)

    def _mixed(self, drafter: SpecDecoder | None) -> StepPlan | None:
        """Decode every running request, then fill the step's token budget with prefill chunks.

        A step that had to retract admits nothing: memory is short, and the freed room would go to
        re-admitting what was just retracted.
        """
        retractions = self.retractions()
        budget = self.config.max_num_batched_tokens
        decode, verify = self._decode(drafter, budget)
        prefill: list[Feed] = []
        if self.retractions() == retractions:
            used = len(decode) + sum(feed.extend_len for feed in verify)
            prefill = self.prefill.schedule(decode_reserve=self.decode.tokens_needed(),
                                            budget=budget - used)
        return StepPlan.build(decode, verify, prefill, self.rows_fit)

    def _decode(self, drafter: SpecDecoder | None, budget: int) -> tuple[list[Feed], list[Feed]]:
        """The running requests' feeds: one token each, and when this step speculates, those
        given drafts (as far as ``budget`` tokens and free KV allow) as verify feeds."""
        feeds = self.decode.schedule()
        if drafter is None or not feeds:
            return feeds, []
        drafts = drafter.draft([feed.req for feed in feeds],
                                 DraftBudget(budget - len(feeds), self.cache.draft_groups))
        plain: list[Feed] = []
        verify: list[Feed] = []
        ends: list[int] = []
        room = self.cache.available_tokens  # one allocation for every verify feed, below
        for feed, draft in zip(feeds, drafts):
            req, end = feed.req, feed.device_len + len(draft)
            needed = self.cache.tokens_needed(req, end) if draft else 0
            if not draft or needed > room:
                plain.append(feed)
                continue
            room -= needed
            ends.append(end)
            verify.append(Feed(req, feed.cached_len, end, len(draft) + 1, draft,
                               self.cache.draft_slot(len(verify))))
        if verify:
            self.cache.allocate_many([feed.req for feed in verify], ends)
        return plain, verify
