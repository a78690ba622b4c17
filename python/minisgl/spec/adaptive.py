"""Per-request draft length from recent acceptance, so that speculation never costs more than it
saves.

A verify step of k + 1 tokens costs more than a one-token decode step; it pays only when enough
drafts are accepted. Each request keeps ``ema``: its recent accepted drafts per step. The next
draft is one longer than that (it grows by one after a fully accepted draft, shrinks after a
rejection), and while ``ema`` is below ``min_expected_accept`` the request does not speculate.
It still drafts in the shadow: the draft is checked against the tokens that then come, for free,
so a request whose text turns repetitive (a file being copied) starts speculating again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_DECAY = 0.5  # weight of the newest observation: a few steps decide


@dataclass
class Acceptance:
    """One request's recent acceptance; ``shadow``: a draft not verified, compared with the
    tokens that come."""

    ema: float
    shadow: list[int] = field(default_factory=list)
    shadow_hits: int = 0

    def record(self, accepted: int) -> None:
        self.ema = (1 - _DECAY) * self.ema + _DECAY * accepted

    def draft_len(self, k_max: int, threshold: float) -> int:
        """0: do not speculate this step (shadow drafting only)."""
        if self.ema < threshold:
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
            self.record(self.shadow_hits)
            self.shadow, self.shadow_hits = [], 0
