"""Which class builds which ``config.json`` architecture."""

from __future__ import annotations

from minisgl.utils import Registry

from .base import BaseLLMModel

MODELS: Registry[type[BaseLLMModel]] = Registry("model architecture")

# Llama-style decoders differ only in config switches read by the shared layers (see base.py).
for _arch in (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
):
    MODELS.register(_arch)(BaseLLMModel)


def get_model_class(architecture: str) -> type[BaseLLMModel]:
    return MODELS.get(architecture)
