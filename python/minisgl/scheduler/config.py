from __future__ import annotations

from dataclasses import dataclass

from minisgl.engine import EngineConfig


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling policy on top of one engine (engine config ⊂ scheduler config)."""

    engine: EngineConfig
    max_prefill_tokens: int = 8192  # token budget of one prefill forward (chunked prefill)
    cache: str = "radix"  # prefix cache: "radix" or "naive"
    eos_token_ids: tuple[int, ...] = ()
    overlap: bool = True  # launch step N+1 before reading step N back

    def __post_init__(self) -> None:
        if self.max_prefill_tokens < 1:
            raise ValueError("max_prefill_tokens must be >= 1")

    @property
    def max_running_reqs(self) -> int:
        return self.engine.max_running_reqs
