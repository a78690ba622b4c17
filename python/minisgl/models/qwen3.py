"""Qwen3: the Llama decoder with an RMSNorm on each query and key head before RoPE."""

from __future__ import annotations

from typing import Any

from .config import ModelConfig, common_fields
from .llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        return ModelConfig(**{**common_fields(raw), "qk_norm": True})
