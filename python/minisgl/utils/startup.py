"""Where a start-up's seconds went: the phases of one process, counted from the launch
(``MINISGL_LAUNCHED_AT``, which ``python -m minisgl`` sets for every process it starts)."""

from __future__ import annotations

import time


def since_launch() -> float | None:
    """Seconds since the launch began, None outside a launch (the offline ``LLM``)."""
    from minisgl.env import LAUNCHED_AT

    try:
        return time.time() - float(LAUNCHED_AT.get())
    except ValueError:
        return None


class Phases:
    """``mark(name)`` ends a phase that began at the previous mark (or at creation); ``str()``
    lists them. ``launch``: the first part's name for the time from the launch to the creation
    (in a spawned process: Python's start, its imports, the parent's work before spawning it)."""

    def __init__(self, launch: str | None = None) -> None:
        self._last = time.perf_counter()
        launched = since_launch() if launch else None
        self._parts = [] if launched is None else [(launch, launched)]

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self._parts.append((name, now - self._last))
        self._last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self._parts)
