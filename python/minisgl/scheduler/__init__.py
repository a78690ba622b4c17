from .config import SchedulerConfig
from .scheduler import Scheduler, TokenOutput

__all__ = ["Scheduler", "SchedulerConfig", "TokenOutput"]
