from .config import SchedulerConfig
from .output import TokenOutput
from .scheduler import Scheduler

__all__ = ["Scheduler", "SchedulerConfig", "TokenOutput"]
