"""The model registry: each ``architectures`` string names one family file, imported lazily, whose
own parser builds the config; registering an architecture is one table entry."""

from __future__ import annotations

import sys

import pytest

from minisgl.models import ARCHITECTURES, BaseLLMModel, ModelConfig, get_model_class, registry

RAW = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
       "num_hidden_layers": 2, "intermediate_size": 96, "rope_parameters": {"rope_theta": 1e4}}


def config(arch: str, **extra) -> ModelConfig:
    return ModelConfig.from_dict({"architectures": [arch], **RAW, **extra})


def test_every_architecture_resolves_to_its_family_file():
    for arch, (module, name) in ARCHITECTURES.items():
        cls = get_model_class(arch)
        assert issubclass(cls, BaseLLMModel) and cls.__name__ == name
        assert cls.__module__ == f"minisgl.models.{module}"


def test_family_files_are_imported_only_when_asked(monkeypatch):
    monkeypatch.delitem(sys.modules, "minisgl.models.qwen3_moe", raising=False)
    config("LlamaForCausalLM")
    assert "minisgl.models.qwen3_moe" not in sys.modules
    config("Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    assert "minisgl.models.qwen3_moe" in sys.modules


def test_each_family_parses_its_own_fields():
    llama, qwen2, qwen3 = (config(a) for a in
                           ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"))
    assert (llama.attention_bias, llama.qk_norm) == (False, False)
    assert (qwen2.attention_bias, qwen2.qk_norm) == (True, False)
    assert (qwen3.attention_bias, qwen3.qk_norm) == (False, True)
    # transformers-5 spelling of the expert count (Mixtral's), and no MoE fields outside the family
    moe = config("Qwen3MoeForCausalLM", num_local_experts=8, num_experts_per_tok=2,
                 moe_intermediate_size=32, mlp_only_layers=[0])
    assert (moe.num_experts, moe.qk_norm, moe.is_sparse_layer(0), moe.is_sparse_layer(1)) == \
        (8, True, False, True)
    assert config("Qwen3ForCausalLM", num_experts=8).num_experts == 0


def test_a_new_architecture_is_one_registry_entry(monkeypatch):
    with pytest.raises(ValueError, match="unknown model architecture 'MyLlama'.*LlamaForCausalLM"):
        config("MyLlama")
    monkeypatch.setitem(registry.ARCHITECTURES, "MyLlama", ("qwen2", "Qwen2ForCausalLM"))
    cfg = config("MyLlama")
    assert cfg.architecture == "MyLlama" and cfg.attention_bias
    assert get_model_class(cfg.architecture).__name__ == "Qwen2ForCausalLM"
