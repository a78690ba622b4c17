from .logger import init_logger
from .registry import Registry

__all__ = ["Registry", "init_logger"]
