"""Qwen2: the Llama decoder with a bias on the q, k and v projections."""

from __future__ import annotations

from typing import Any

from .config import ModelConfig, common_fields
from .llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        return ModelConfig(**{**common_fields(raw),
                              "attention_bias": bool(raw.get("attention_bias", True))})
