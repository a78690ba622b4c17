"""Acceptance statistics of speculative decoding, per method: what ``/metrics`` and the log show.

``mean_accepted_len`` counts the tokens a verify step emits per request (accepted drafts plus the
one the target model adds), vLLM's "mean acceptance length"; ``acceptance_rate`` is accepted
drafts over proposed drafts. Requests that cannot speculate are counted by reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    method: str
    verify_steps: int = 0  # (request, step) pairs that verified at least one draft
    draft_tokens: int = 0
    accepted_tokens: int = 0
    ahead_feeds: int = 0  # verify feeds drafted on a verify step in flight (``draft_ahead``)
    ahead_dropped: int = 0  # of those, dropped: the step before rejected a draft
    # requests that never speculate, by reason ("penalties", "grammar")
    skipped: dict[str, int] = field(default_factory=dict)

    def add(self, drafted: int, accepted: int) -> None:
        self.verify_steps += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_len(self) -> float:
        steps = self.verify_steps
        return (self.accepted_tokens + steps) / steps if steps else 0.0

    def line(self) -> str:
        skipped = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items())) or "none"
        return (f"speculative {self.method}: acceptance rate {self.acceptance_rate:.1%}, "
                f"mean accepted length {self.mean_accepted_len:.2f}, "
                f"{self.verify_steps} verify steps, requests not speculating: {skipped}")
