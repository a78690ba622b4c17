"""Stack dumps on demand, for hangs (a TP rank waiting on a collective, a stuck step)."""

from __future__ import annotations

import faulthandler
import signal


def enable_stack_dumps() -> None:
    """After this, ``kill -USR1 PID`` prints every thread's Python stack to the process's stderr."""
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
