"""Where a start-up's seconds went: the phases of one process, counted from the launch
(``MINISGL_LAUNCHED_AT``, which ``python -m minisgl`` sets for every process it starts)."""

from __future__ import annotations

import os
import time


def process_age() -> float | None:
    """Seconds since this process started (Linux's ``/proc``: the offline ``LLM`` has no launch
    to count from), None where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:  # field 22, starttime: clock ticks after the boot
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return None


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
    (in a spawned process: Python's start, its imports, the parent's work before spawning it);
    ``launched``: those seconds when they are not the launch's (``process_age``)."""

    def __init__(self, launch: str | None = None, launched: float | None = None) -> None:
        self._last = time.perf_counter()
        if launch and launched is None:
            launched = since_launch()
        self._parts = [(launch, launched)] if launch and launched is not None else []

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self._parts.append((name, now - self._last))
        self._last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self._parts)
