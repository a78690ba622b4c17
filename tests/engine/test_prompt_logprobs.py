"""Prompt log-probs (``echo`` + ``logprobs``, SGLang's ``logprob_start_len``) against transformers.

The engine scores prompt tokens during prefill, chunk by chunk and in row blocks; the values must
equal transformers' float32 log-softmax within 1e-3 however the prompt is split, cached or batched.
"""

from __future__ import annotations

import openai
import pytest
import torch

from helpers.device import TEST_DEVICE
from helpers.hf_models import hf_prefill_logits, make_tiny_checkpoint, random_prompts
from helpers.server_utils import start_server
from minisgl import LLM, SamplingParams
from minisgl.engine import prompt_logprobs as module

pytestmark = pytest.mark.any_device
VOCAB = 256
TOL = 1e-3


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("plp") / "qwen3")


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(3, [7, 29, 61], VOCAB, seed=3)


@pytest.fixture(scope="module")
def reference(ckpt, prompts):
    """Per prompt: the log-softmax rows ``[len, vocab]`` (row p predicts token p + 1)."""
    return [torch.log_softmax(x, -1) for x in hf_prefill_logits(ckpt, prompts)]


def _check(entries, prompt, ref, start=0, top=0):
    assert [e[0] for e in entries] == prompt[start:]
    values = [e[1] for e in entries]
    if start == 0:
        assert values[0] is None and entries[0][2] == []
    first = max(start, 1)
    want = ref[torch.arange(first - 1, len(prompt) - 1), torch.tensor(prompt[first:])]
    got = torch.tensor(values[first - start:])
    assert torch.allclose(got, want, atol=TOL, rtol=0), (got - want).abs().max()
    for (_, _, alts), row in zip(entries[first - start:], ref[first - 1:]):
        assert len(alts) == top
        if top:
            ids = [a for a, _ in alts]
            assert torch.allclose(torch.tensor([b for _, b in alts]), row[ids], atol=TOL)
            assert torch.allclose(torch.tensor([b for _, b in alts]), row.topk(top).values,
                                  atol=TOL)


def _llm(ckpt, **options) -> LLM:
    return LLM(str(ckpt), device=TEST_DEVICE, dtype="float32", num_pages=1024, **options)


@pytest.mark.parametrize("options", [dict(page_size=1), dict(page_size=4, max_prefill_tokens=13)],
                         ids=["one_chunk", "chunked_page4"])
def test_llm_prompt_logprobs_match_transformers(ckpt, prompts, reference, options, monkeypatch):
    monkeypatch.setattr(module, "_BLOCK_BYTES", 5 * 4 * VOCAB)  # 5 rows per block: many blocks
    llm = _llm(ckpt, **options)
    only = SamplingParams(max_tokens=0, prompt_logprobs=True, top_logprobs=3)
    outs = llm.generate(prompts, only)
    for out, prompt, ref in zip(outs, prompts, reference):
        assert out.token_ids == [] and out.finish_reason == "length" and out.text == ""
        _check([(e.token_id, e.logprob, e.top_logprobs) for e in out.prompt_logprobs], prompt,
               ref, top=3)
    # again: the prompts are in the prefix cache now, yet must be computed (not skipped)
    hit = llm.generate(prompts[2], SamplingParams(max_tokens=2, prompt_logprobs=True,
                                                   logprob_start_len=40, temperature=0))[0]
    assert len(hit.token_ids) == 2
    _check([(e.token_id, e.logprob, e.top_logprobs) for e in hit.prompt_logprobs], prompts[2],
           reference[2], start=40)
    assert llm.generate(prompts[0], SamplingParams(max_tokens=2))[0].prompt_logprobs is None
    llm.scheduler.check_integrity()
    llm.close()


def test_max_tokens_zero_without_logprobs(ckpt, prompts):
    llm = _llm(ckpt)
    out = llm.generate(prompts, SamplingParams(max_tokens=0))
    assert all(o.token_ids == [] and o.finish_reason == "length" for o in out)
    assert all(o.prompt_logprobs is None for o in out)
    assert not llm.scheduler.reqs
    llm.scheduler.check_integrity()
    llm.close()


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=-1)
    with pytest.raises(ValueError, match="logprob_start_len"):
        SamplingParams(logprob_start_len=-2)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=1)


@pytest.mark.slow
def test_server_echo_and_generate(ckpt, prompts, reference, tmp_path):
    """The official client's echo + logprobs + max_tokens 0 (lm-evaluation-harness's request),
    streamed and not, and the native /generate with logprob_start_len."""
    import httpx

    server = start_server(str(ckpt), "--num-pages", "1024", "--max-prefill-tokens", "16",
                          log_dir=str(tmp_path))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        resp = client.completions.create(model=str(ckpt), prompt=prompts, echo=True, logprobs=2,
                                         max_tokens=0)
        assert len(resp.choices) == 3 and resp.usage.completion_tokens == 0
        for choice, prompt, ref in zip(resp.choices, prompts, reference):
            lp = choice.logprobs
            assert choice.finish_reason == "length"
            assert choice.text == "".join(f"token_id:{t}" for t in prompt)  # no tokenizer
            assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
            assert lp.tokens == [f"token_id:{t}" for t in prompt]
            entries = [(t, v, []) for t, v in zip(prompt, lp.token_logprobs)]
            _check(entries, prompt, ref)
            assert all(len(d) in (2, 3) for d in lp.top_logprobs[1:])
            assert lp.text_offset[1] == len(lp.tokens[0])
        # with output tokens, streamed: the prompt comes first, then the completion
        stream = client.completions.create(model=str(ckpt), prompt=prompts[0], echo=True,
                                           logprobs=0, max_tokens=3, stream=True,
                                           temperature=0)
        chunks = [c.choices[0] for c in stream if c.choices]
        tokens = sum((c.logprobs.tokens for c in chunks if c.logprobs), [])
        values = sum((c.logprobs.token_logprobs for c in chunks if c.logprobs), [])
        assert len(tokens) == len(prompts[0]) + 3 and values[0] is None
        _check([(t, v, []) for t, v in zip(prompts[0], values)], prompts[0], reference[0])
        only = list(client.completions.create(model=str(ckpt), prompt=prompts[2], echo=True,
                                              max_tokens=0, stream=True))
        assert "".join(c.choices[0].text for c in only) == "".join(f"token_id:{t}"
                                                                   for t in prompts[2])
        assert only[-1].choices[0].finish_reason == "length"
        assert all(c.choices[0].logprobs is None for c in only)
        r = httpx.post(f"{server.url}/generate", json={
            "input_ids": prompts[1], "return_logprob": True, "logprob_start_len": 5,
            "top_logprobs_num": 2, "sampling_params": {"max_new_tokens": 0}}).json()
        meta = r["meta_info"]
        assert r["output_ids"] == [] and meta["output_token_logprobs"] == []
        entries = [(t, v, [(a, b) for b, a in tops]) for (v, t), tops
                   in zip(meta["input_token_logprobs"], meta["input_top_logprobs"])]
        _check(entries, prompts[1], reference[1], start=5, top=2)
        bad = httpx.post(f"{server.url}/generate", json={"input_ids": [1], "logprob_start_len": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "logprob_start_len"
    finally:
        server.stop()


@pytest.mark.slow
def test_tp2_prompt_logprobs(ckpt, prompts, reference):
    """Two gloo ranks: every rank scores the same rows (the vocabulary-parallel LM head gathers)."""
    if TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("TP=2 on CUDA needs two GPUs")
    with LLM(str(ckpt), tp=2, device=TEST_DEVICE, dtype="float32", num_pages=512,
             max_prefill_tokens=16) as llm:
        outs = llm.generate(prompts, SamplingParams(max_tokens=0, prompt_logprobs=True,
                                                    top_logprobs=2))
    for out, prompt, ref in zip(outs, prompts, reference):
        _check([(e.token_id, e.logprob, e.top_logprobs) for e in out.prompt_logprobs], prompt,
               ref, top=2)
