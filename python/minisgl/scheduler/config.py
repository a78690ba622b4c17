from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig
from minisgl.speculative.config import SpecConfig

from .policy import POLICIES

SCHEDULE_MODES = ("mixed", "prefill-first")
# how long a loop waits while every request waits for a compiler (``Scheduler.only_waiting``): no
# spinning beside the compiler's thread
WAITING_POLL_S = 0.002


def check_schedule(mode: str, policy: str) -> None:
    """``ValueError`` naming the field for an unknown schedule mode or admission policy."""
    if mode not in SCHEDULE_MODES:
        raise ValueError(f"schedule_mode: {mode!r} is not one of {', '.join(SCHEDULE_MODES)}")
    if policy not in POLICIES:
        raise ValueError(f"schedule_policy: {policy!r} is not one of {', '.join(POLICIES)}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling policy on top of one engine (engine config ⊂ scheduler config).

    ``mixed``: every step carries one decode token of each running request, plus prefill chunks up
    to ``max_num_batched_tokens`` tokens in all (and ``max_prefill_tokens`` of prefill at most).
    ``prefill-first`` (the ablation): a step is all prefill (up to ``max_prefill_tokens``) while
    anything waits, and running requests pause meanwhile.
    """

    engine: EngineConfig
    max_prefill_tokens: int = 8192  # prefill tokens of one forward at most (chunked prefill)
    cache: str = "radix"  # prefix cache: "radix" or "naive"
    eos_token_ids: tuple[int, ...] = ()
    overlap: bool = True  # launch step N+1 before reading step N back
    schedule_mode: str = "mixed"
    max_num_batched_tokens: int = 8192  # mixed: tokens of one step, decode rows included
    schedule_policy: str = "lpm"  # admission order: "lpm" or "fcfs"
    max_wait_steps: int = 64  # lpm: a request waiting this many steps is admitted in arrival order
    prefill_yield: bool = True  # a chunked prompt yields half a step to a shorter one behind it
    warmup: bool = True  # run every kernel variant before serving (``warmup.py``)
    spec: SpecConfig | None = None  # speculative decoding (``minisgl/speculative/``); None: off

    def __post_init__(self) -> None:
        for name in ("max_prefill_tokens", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_wait_steps < 0:
            raise ValueError("max_wait_steps must be >= 0")
        check_schedule(self.schedule_mode, self.schedule_policy)

    @property
    def max_running_reqs(self) -> int:
        return self.engine.max_running_reqs

    @property
    def mixed(self) -> bool:
        return self.schedule_mode == "mixed"
