from .config import EngineConfig
from .engine import Engine
from .types import ForwardOutput

__all__ = ["Engine", "EngineConfig", "ForwardOutput"]
