from .base import BaseLLMModel
from .config import ModelConfig, RotaryConfig, load_eos_token_ids
from .register import MODELS, get_model_class

__all__ = ["MODELS", "BaseLLMModel", "ModelConfig", "RotaryConfig", "get_model_class", "load_eos_token_ids"]
