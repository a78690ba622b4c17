from .config import EngineOptions
from .llm import LLM, GenerateOutput, TokenLogprob

__all__ = ["LLM", "EngineOptions", "GenerateOutput", "TokenLogprob"]
