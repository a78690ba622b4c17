"""Admission order of the waiting queue: ``fcfs`` (arrival order) or ``lpm`` (longest prefix match).

LPM admits first the requests whose prompts the prefix cache already holds the longest part of, as
SGLang does: while their prefix is cached (and locked by the admission) they cost only their new
tokens, and requests that share a system prompt are admitted together instead of pushing each
other's prefix out of the cache. Left alone it could starve a request with nothing cached behind a
stream of requests with hits, so a request that has waited ``max_wait_steps`` scheduling steps is
admitted before everything else, in arrival order.

The order only ever changes among requests that hold nothing yet::

    queue: | admitted (half-fed chunk, in flight) | retracted | new arrivals: reordered |

An admitted request keeps its place (its chunk goes on next), and a retracted one (it has output
already) goes before new arrivals, as with ``fcfs``.
"""

from __future__ import annotations

from itertools import count
from typing import Callable, Iterable

from minisgl.core import Req

POLICIES = ("lpm", "fcfs")
LPM_WINDOW = 128  # prefix matches per step at most: the rest of the queue stays in arrival order


class AdmissionPolicy:
    def __init__(self, name: str, max_wait_steps: int, hit_len: Callable[[Req], int]) -> None:
        if name not in POLICIES:
            raise ValueError(f"schedule_policy: {name!r} is not one of {', '.join(POLICIES)}")
        self.name, self.max_wait_steps, self.hit_len = name, max_wait_steps, hit_len
        self.step = 0
        self._arrivals = count()
        self._seen: dict[Req, tuple[int, int]] = {}  # req -> (arrival number, step it arrived at)

    def arrive(self, req: Req) -> None:
        self._seen.setdefault(req, (next(self._arrivals), self.step))

    def forget(self, req: Req) -> None:
        self._seen.pop(req, None)

    def waited(self, req: Req) -> int:
        """Scheduling steps since ``req`` arrived."""
        return self.step - self._seen[req][1]

    def tick(self) -> None:
        """One scheduling step has passed (every step, whether or not anything is admitted)."""
        self.step += 1

    def order(self, waiting: Iterable[Req]) -> list[Req]:
        """The queue in the order admission should consider it."""
        queue = list(waiting)
        if self.name == "fcfs":
            return queue
        held = [r for r in queue if r.table_idx >= 0 or r.output_len > 0]
        new = [r for r in queue if r.table_idx < 0 and r.output_len == 0]
        new.sort(key=lambda r: self._seen[r][0])
        starved = [r for r in new if self.waited(r) >= self.max_wait_steps]
        rest = [r for r in new if self.waited(r) < self.max_wait_steps]
        window, tail = rest[:LPM_WINDOW], rest[LPM_WINDOW:]
        if len(window) < 2:
            return held + starved + window + tail
        hits = {id(r): self.hit_len(r) for r in window}
        window.sort(key=lambda r: -hits[id(r)])  # stable: equal hits stay in arrival order
        return held + starved + window + tail
