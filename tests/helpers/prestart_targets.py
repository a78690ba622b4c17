"""Work handed to a prestarted process in tests/server/test_prestart.py."""

from __future__ import annotations

import os


def report(name: str, *, ready) -> None:
    """Answer on the ready pipe with what the process sees: an environment variable, the level
    of minisgl's logger and the modules already imported."""
    import logging
    import sys

    ready.send(("ok", {"value": os.environ.get(name), "pid": os.getpid(),
                       "level": logging.getLogger("minisgl").level, "modules": set(sys.modules)}))
