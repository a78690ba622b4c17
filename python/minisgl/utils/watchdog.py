"""A scheduler step that never ends (a rank lost in a collective, a wedged device) must not hang the
server: the watchdog dumps every thread's stack and ends the process, and the launcher then fails
the requests in flight and reports the server unhealthy."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

WATCHDOG_EXIT_CODE = 70


class Watchdog:
    """Call ``beat()`` whenever the loop makes progress; with no beat for ``timeout`` seconds the
    process prints its stacks and exits with ``WATCHDOG_EXIT_CODE``. ``timeout`` 0 disables it."""

    def __init__(self, timeout: float, name: str) -> None:
        self.timeout, self.name = timeout, name
        self._last = time.monotonic()
        if timeout > 0:
            threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True).start()

    def beat(self) -> None:
        self._last = time.monotonic()

    def _watch(self) -> None:
        period = min(1.0, self.timeout / 4)
        while True:
            time.sleep(period)
            stalled = time.monotonic() - self._last
            if stalled > self.timeout:
                print(f"{self.name}: no progress for {stalled:.0f} s (watchdog timeout "
                      f"{self.timeout:g} s); stacks follow, then exit", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                os._exit(WATCHDOG_EXIT_CODE)
