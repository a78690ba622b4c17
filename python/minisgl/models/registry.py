"""Which model file builds which ``config.json`` architecture: one line per architecture, the
module imported only when that architecture is asked for. Architectures whose model is another's
(a checkpoint layout that differs only in its name) name that class: an alias, not a subclass."""

from __future__ import annotations

import importlib

# architecture -> (module under minisgl.models, class)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    # Mistral's decoder is Llama's (a ``sliding_window`` in its config is not applied)
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "GptOssForCausalLM": ("gpt_oss", "GptOssForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "Gemma3ForConditionalGeneration": ("gemma3", "Gemma3ForConditionalGeneration"),
    "Gemma4ForCausalLM": ("gemma4", "Gemma4ForCausalLM"),
    # the multimodal checkpoint (its ``text_config``, its language model; images through
    # ``engine/images.py``)
    "Gemma4ForConditionalGeneration": ("gemma4", "Gemma4ForConditionalGeneration"),
    # hybrid Gated DeltaNet / gated attention (dense or MoE by their config)
    "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    "Qwen3_5ForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
    # Qwen3.5-MoE and Qwen3.6: the Qwen3.5 decoder, its MLPs MoE by the config
    "Qwen3_5MoeForConditionalGeneration": ("qwen3_5", "Qwen3_5ForConditionalGeneration"),
}


def get_model_class(architecture: str) -> type:
    """The model class (a ``BaseLLMModel``) of ``architecture``, its module imported now."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown model architecture {architecture!r}; choose one of: "
                         f"{', '.join(sorted(ARCHITECTURES))}")
    module, name = ARCHITECTURES[architecture]
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)
