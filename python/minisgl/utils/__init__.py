import os

from .logger import init_logger
from .registry import Registry

__all__ = ["Registry", "init_logger", "usable_cpus"]


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS keeps one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
