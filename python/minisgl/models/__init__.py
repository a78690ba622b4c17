from .base import BaseLLMModel
from .config import ModelConfig, RotaryConfig, eos_token_ids, load_eos_token_ids
from .registry import ARCHITECTURES, get_model_class

__all__ = ["ARCHITECTURES", "BaseLLMModel", "ModelConfig", "RotaryConfig", "eos_token_ids",
           "get_model_class", "load_eos_token_ids"]
