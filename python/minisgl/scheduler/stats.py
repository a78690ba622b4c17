"""What the scheduler process reports: each request's first forward, the live log line, and the
state pool's and speculation's counters of its stats.

All are read from the outside of ``Scheduler`` (its queues and outputs after each step), so the
scheduling code stays free of bookkeeping that only the server needs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minisgl.core import Req
from minisgl.message import SchedulerStatsMsg

from .output import TokenOutput

if TYPE_CHECKING:
    from .scheduler import Scheduler


class FirstForwards:
    """When each request's first forward was launched (Unix time, for the API's queue time).

    New requests are admitted in arrival order (a prefill batch is a prefix of the waiting queue;
    only retracted requests, already stamped, jump ahead), so after a step the newly started ones
    are a prefix of ``unstarted`` and the scan stops at the first request still waiting.
    """

    def __init__(self) -> None:
        self.unstarted: OrderedDict[int, Req] = OrderedDict()
        self.started: dict[int, float] = {}

    def add(self, req: Req) -> None:
        self.unstarted[req.uid] = req

    def forget(self, uid: int) -> None:
        self.unstarted.pop(uid, None)
        self.started.pop(uid, None)

    def mark(self, launched_at: float, live: dict[int, Req]) -> None:
        """Once a step launched at ``launched_at`` returns: stamp the requests it fed first."""
        while self.unstarted:
            uid, req = next(iter(self.unstarted.items()))
            if req.device_len > 0 or req.output_len > 0:
                self.started[uid] = launched_at
            elif live.get(uid) is req:
                return  # still waiting, and so is everyone behind it
            del self.unstarted[uid]

    def pop(self, uid: int) -> float:
        """The stamp of ``uid`` (0.0 if unknown), forgotten: it is sent with the first token."""
        self.unstarted.pop(uid, None)
        return self.started.pop(uid, 0.0)


@dataclass
class LiveStats:
    """Tokens of one logging window.

    Prefill counts the tokens the prefill chunks scheduled in the window computed (the prefix
    cache's hits are not computed; a retracted request's re-fed tokens are, as work done again), so
    a long prompt fed chunk by chunk shows its rate while it advances, not at its first token
    minutes later (a 20k-token prompt on a CPU). Decode counts the tokens after each request's
    first; the hit rate is over the prompts whose first token came in the window. The line also
    says how far the half-fed prompts are (``prefilling``).
    """

    interval: float
    started: float = field(default_factory=time.monotonic)
    fed_tokens: int = 0  # the scheduler's count of prefill tokens scheduled, at the last step
    prefill_tokens: int = 0
    decode_tokens: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0

    def add(self, outputs: list[TokenOutput], fed_tokens: int) -> None:
        """One step's outputs; ``fed_tokens``: the prefill tokens scheduled so far, in all."""
        self.prefill_tokens += fed_tokens - self.fed_tokens
        self.fed_tokens = fed_tokens
        for out in outputs:
            req = out.first
            if req is None:
                self.decode_tokens += 1
                continue
            self.prompt_tokens += req.prompt_len
            self.hit_tokens += req.cache_hit_len

    def due(self, now: float) -> bool:
        return self.interval > 0 and now - self.started >= self.interval

    def roll(self, now: float, stats: SchedulerStatsMsg,
             prefilling: tuple[int, int] = (0, 0)) -> str | None:
        """The line of the window ending ``now`` (None when nothing happened); start a new one.
        ``prefilling``: the prompt tokens in the KV cache, and in all, of the half-fed prompts."""
        elapsed = max(now - self.started, 1e-9)
        busy = self.prefill_tokens or self.decode_tokens or stats.num_running or stats.num_waiting
        line = None
        if busy:
            kv = stats.kv_used_tokens / max(stats.kv_total_tokens, 1)
            hit = self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
            line = (f"prefill throughput: {self.prefill_tokens / elapsed:.1f} tok/s, "
                    f"decode throughput: {self.decode_tokens / elapsed:.1f} tok/s, "
                    f"#running: {stats.num_running}, #queued: {stats.num_waiting}, "
                    f"KV usage: {kv:.1%}, cache hit rate: {hit:.1%}")
            if prefilling[1]:
                line += f", prefilling: {prefilling[0]} of {prefilling[1]} prompt tokens"
        self.started, self.prefill_tokens, self.decode_tokens = now, 0, 0
        self.prompt_tokens = self.hit_tokens = 0
        return line


def state_stats(s: Scheduler) -> dict[str, int]:
    """The recurrent-state pool's occupancy (hybrid models; empty otherwise)."""
    pool = s.engine.state_pool
    if pool is None:
        return {}
    return dict(state_slots_used=s.table.size - s.table.num_free,
                state_slots_total=s.table.size,
                state_snapshots=pool.num_snapshots - pool.num_free_snapshots,
                state_pool_bytes=pool.total_bytes)


def spec_stats(s: Scheduler) -> dict:
    """Speculative decoding's counters (empty when it is off)."""
    if s.spec is None:
        return {}
    st = s.spec.stats
    return dict(spec_method=st.method, spec_verify_steps=st.verify_steps,
                spec_draft_tokens=st.draft_tokens, spec_accepted_tokens=st.accepted_tokens,
                spec_skipped_requests=sum(st.skipped.values()))
