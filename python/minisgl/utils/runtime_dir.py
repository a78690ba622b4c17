"""Private runtime directories (IPC socket files) of server launches, and their cleanup.

A launch removes its own directory when it exits cleanly; one killed with ``kill -9`` cannot, so
each new launch removes the directories of launches whose process is gone. The directory's name says
whose it is: ``minisgl-<pid>-<start time>-<random>``; the start time (Linux: clock ticks since boot,
from ``/proc``) tells a dead launcher from a new process that reuses its pid (a container's server
is often pid 1 on every start).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from .logger import init_logger

logger = init_logger(__name__)

PREFIX = "minisgl-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\d*)-")


def make_runtime_dir() -> str:
    """A private directory (mode 700) for this launch's IPC socket files; stale ones go first."""
    removed = remove_stale_runtime_dirs()
    if removed:
        logger.info("removed %d runtime directories of dead minisgl processes", len(removed))
    pid = os.getpid()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{_start_time(pid)}-")


def remove_runtime_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def remove_stale_runtime_dirs(root: str | None = None) -> list[str]:
    """Remove this user's runtime directories under ``root`` (the temp dir) whose launcher is gone;
    return their paths."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        match = _NAME.match(name)
        path = os.path.join(root, name)
        if match is None or not _owned(path):
            continue
        pid, started = int(match.group(1)), match.group(2)
        if not _alive(pid, started):
            remove_runtime_dir(path)
            removed.append(path)
    return removed


def _owned(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return os.path.isdir(path) and not os.path.islink(path) and st.st_uid == os.getuid()


def _alive(pid: int, started: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to judge
        return True
    return not started or _start_time(pid) in ("", started)


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" where /proc is not available)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name in (...) may hold spaces
