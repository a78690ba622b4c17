"""Per-request draft length from recent acceptance, so that speculation never costs more than it
saves.

A verify step of k + 1 tokens costs more than a one-token decode step; it pays only when enough
drafts are accepted. Each request keeps ``ema``: its recent accepted drafts per step. The next
draft is one longer than that (it grows by one after a fully accepted draft, shrinks after a
rejection). A verify step emits ``accepted + 1`` tokens for ``StepCost.ratio`` decode steps'
time, so while ``ema`` is below ``ratio - 1`` (and below ``min_expected_accept``) the request does
not speculate. The ratio is measured, not assumed: it differs by model and GPU (a small model's
decode graph at 2+ rows costs far more than its one-row graph; docs/performance.md). It still
drafts in the shadow: the draft is checked against the tokens that then come, for free,
so a request whose text turns repetitive (a file being copied) starts speculating again. A
request whose proposer found nothing to draft ``MISSES`` steps in a row (chat, where nothing
repeats) also stops asking, since a step that might draft gives up overlap scheduling for nothing,
until a shadow proposal finds a draft again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_DECAY = 0.5  # weight of the newest observation: a few steps decide
# the newest verify step's weight in ``full``, which gates drafting ahead: about the last eight
# steps (at ``_DECAY`` one kept step after a rejection read as 0.75, and text edited every 12-16
# tokens was drafted ahead in vain half the time or more: verify_host_cost.py)
_FULL_DECAY = 0.125
# steps in a row without a draft after which a request stops asking for one (a step that may draft
# reads the forward in flight back first, losing overlap) until its shadow proposal finds one
MISSES = 2


@dataclass
class Acceptance:
    """One request's recent acceptance; ``shadow``: a draft not verified, compared with the
    tokens that come."""

    ema: float
    full: float = 1.0  # recent share of verify steps that kept all their drafts
    misses: int = 0  # steps in a row that asked for a draft and the proposer had none
    shadow: list[int] = field(default_factory=list)
    shadow_hits: int = 0

    def record(self, accepted: int, drafted: int) -> None:
        self.ema = (1 - _DECAY) * self.ema + _DECAY * accepted
        self.full = (1 - _FULL_DECAY) * self.full + _FULL_DECAY * (accepted == drafted)

    def draft_len(self, k_max: int, threshold: float) -> int:
        """0: do not speculate this step (shadow drafting only)."""
        if self.ema < threshold or self.misses >= MISSES:
            return 0
        return min(k_max, max(1, math.ceil(self.ema) + 1))

    def observe(self, tokens: list[int]) -> None:
        """Tokens that came without speculation: score the shadow draft against them."""
        for token in tokens:
            if not self.shadow:
                return
            if self.shadow[self.shadow_hits] == token:
                self.shadow_hits += 1
                if self.shadow_hits < len(self.shadow):
                    continue
            self.record(self.shadow_hits, len(self.shadow))
            self.shadow, self.shadow_hits = [], 0


_PROBE_EVERY = 64  # verify steps between two measurements of the plain decode step
_PROBE_STEPS = 3  # plain steps a probe takes: the first still waits for the verify step before


@dataclass
class StepCost:
    """Wall time of a verify step and of a plain decode step (exponential averages over recent
    steps of a small batch), and when to measure the plain step again: speculating requests never
    take one, so after ``_PROBE_EVERY`` verify steps nobody drafts for ``_PROBE_STEPS`` steps."""

    verify: float | None = None
    plain: float | None = None
    since_plain: int = 0
    probing: int = 0

    def add(self, verified: bool, seconds: float) -> None:
        """A decode step's wall time (``verified``: it verified drafts)."""
        if verified:
            self.verify = _average(self.verify, seconds)
            self.since_plain += 1
            return
        if self.probing:
            self.probing -= 1
            if self.probing == _PROBE_STEPS - 1:
                return  # this step still waited for the verify step before it
        self.plain = _average(self.plain, seconds)
        self.since_plain = 0

    def probe(self) -> bool:
        """Whether this step must be a plain one (a measurement of the plain step is due)."""
        if self.probing or (self.since_plain >= _PROBE_EVERY or self.plain is None) and \
                self.verify is not None:
            self.probing = self.probing or _PROBE_STEPS
            return True
        return False

    @property
    def ratio(self) -> float:
        """A verify step's time in plain decode steps (1 until both are measured)."""
        if self.verify is None or not self.plain:
            return 1.0
        return self.verify / self.plain


def _average(old: float | None, new: float) -> float:
    return new if old is None else 0.8 * old + 0.2 * new
