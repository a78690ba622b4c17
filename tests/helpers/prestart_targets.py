"""Work handed to a prestarted scheduler process in tests/server/test_prestart.py."""

from __future__ import annotations

import os


def report(name: str, *, ready) -> None:
    """Answer on the ready pipe with what the process sees: an environment variable, the level
    of minisgl's logger and whether the scheduler's modules are already imported."""
    import logging
    import sys

    ready.send(("ok", {"value": os.environ.get(name), "pid": os.getpid(),
                       "level": logging.getLogger("minisgl").level,
                       "imported": "minisgl.scheduler.io" in sys.modules}))
