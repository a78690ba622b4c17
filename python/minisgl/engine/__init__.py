from .config import EngineConfig
from .engine import Engine, ForwardOutput

__all__ = ["Engine", "EngineConfig", "ForwardOutput"]
