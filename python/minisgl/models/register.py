"""Which class builds which ``config.json`` architecture."""

from __future__ import annotations

from minisgl.utils import Registry

from .base import BaseLLMModel
from .qwen3_5 import Qwen3_5Model
from .qwen3_next import HybridModel

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

# hybrid Gated DeltaNet / gated attention decoders (dense or MoE by their config)
MODELS.register("Qwen3NextForCausalLM")(HybridModel)
for _arch in ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
              "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"):
    MODELS.register(_arch)(Qwen3_5Model)


def get_model_class(architecture: str) -> type[BaseLLMModel]:
    return MODELS.get(architecture)
