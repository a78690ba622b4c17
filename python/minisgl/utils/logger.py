"""One logger per module; the TP rank (when set) prefixes every line."""

from __future__ import annotations

import logging
import os
import sys

from minisgl.env import LOG_LEVEL

_FORMAT = "[%(asctime)s %(rank)s%(levelname)s %(name)s] %(message)s"


class _RankFilter(logging.Filter):
    def __init__(self, rank: int | None) -> None:
        super().__init__()
        self.rank = "" if rank is None else f"TP{rank} "

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


def init_logger(name: str, rank: int | None = None) -> logging.Logger:
    """Return ``logging.getLogger(name)`` with the project's format, configured once per process."""
    root = logging.getLogger("minisgl")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(LOG_LEVEL.get().upper())
        root.propagate = False
    if rank is not None:
        for handler in root.handlers:
            handler.filters.clear()
            handler.addFilter(_RankFilter(rank))
    elif not any(isinstance(f, _RankFilter) for h in root.handlers for f in h.filters):
        for handler in root.handlers:
            handler.addFilter(_RankFilter(None))
    return logging.getLogger(name)


def set_log_level(level: str) -> None:
    """The level of this process and of every process it starts afterwards (through the
    environment, which children read when they configure their logger)."""
    os.environ[LOG_LEVEL.name] = level.upper()
    init_logger("minisgl")
    logging.getLogger("minisgl").setLevel(level.upper())
