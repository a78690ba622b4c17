"""The EAGLE-3 speculative method on tiny Llama, Qwen2 and Qwen3 targets (four layers, so three
distinct aux layers exist) given random EAGLE-3 drafts in the checkpoint layout SGLang and vLLM
load: the target hands over the right layers' residual streams (against transformers), the
draft's forward and drafts are the layout's (against a plain-torch reimplementation from the raw
tensors), and outputs with EAGLE-3 drafts are the outputs without speculation. Config, weights
and flags: ``test_spec_eagle3_config.py``."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from safetensors.torch import load_file

from helpers.device import TEST_DEVICE
from helpers.eagle3_drafts import (
    VOCAB,
    eagle3_spec,
    make_checkpoints,
    make_draft,
    reference_drafts,
    reference_logits,
    reference_step,
)
from helpers.hf_models import hf_model, random_prompts
from helpers.spec_spy import run_head, spy_on_proposer
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return make_checkpoints(tmp_path_factory.mktemp("eagle3"))


def make_llm(path, spec=None, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(str(path), device=TEST_DEVICE, dtype="float32", speculative_config=spec,
               **options)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_draft_forward_is_the_checkpoint_layout(checkpoints, arch):
    """One step over 3 positions after 5 cached ones: the pre-norm output, the new K/V and the
    draft-vocabulary logits, against the plain-torch reference."""
    target, draft = checkpoints[arch]
    llm = make_llm(target, eagle3_spec(draft))
    head = llm.scheduler.engine.model.eagle3
    w = load_file(str(draft / "model.safetensors"))
    torch.manual_seed(0)
    hidden, th = head.cfg.hidden_size, head.cfg.target_hidden_size
    past_k, past_v = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    embeds, aux, pos = torch.randn(3, hidden), torch.randn(3, 3 * th), torch.tensor([5, 6, 7])
    engine = llm.scheduler.engine
    dev = engine.device
    with torch.inference_mode():
        out, k, v = run_head(
            engine, head.spec.kv_layer,
            lambda positions: head(embeds.to(dev), aux.to(dev), positions, engine.ctx, True),
            past_k.to(dev), past_v.to(dev), 3)
        logits = head.lm_head(head.norm(out))
    ref, ref_k, ref_v = reference_step(w, embeds, aux @ w["fc.weight"].T, pos, past_k, past_v)
    for got, want in ((out, ref), (k, ref_k), (v, ref_v), (logits, reference_logits(w, ref))):
        torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
    llm.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_drafts_are_the_checkpoint_layout(checkpoints, arch):
    """Chunked prefill then decode: the aux rows are transformers' hidden states of the layers
    (llama and qwen2, whose layers are all below the last), and every step's drafts are the
    plain-torch reference's drafts from those rows."""
    target, draft = checkpoints[arch]
    llm = make_llm(target, eagle3_spec(draft, k=4), max_prefill_tokens=16)
    rows, calls = spy_on_proposer(llm.scheduler.spec.proposer)
    prompt = random_prompts(1, [40], VOCAB, seed=7)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    ids = prompt + out[0].token_ids
    llm.close()
    assert len(calls) > 3 and all(drafts for _, drafts in calls)
    aux = torch.stack([rows[p] for p in range(len(ids) - 1)]).float().cpu()
    if arch != "qwen3":
        with torch.no_grad():
            states = hf_model(target)(torch.tensor([ids[:-1]]), output_hidden_states=True)
        expected = torch.cat([states.hidden_states[i + 1][0] for i in (0, 1, 2)], -1)
        torch.testing.assert_close(aux, expected, atol=1e-4, rtol=1e-4)
    w = load_file(str(draft / "model.safetensors"))
    embed = w.get("embed_tokens.weight")
    if embed is None:
        embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    for ids, drafts in calls:
        assert reference_drafts(w, embed, aux, ids, len(drafts)) == drafts


@pytest.mark.parametrize("arch, page_size", [("llama", 1), ("qwen3", 16), ("llama_echo", 4),
                                             pytest.param("llama", 16, marks=pytest.mark.slow),
                                             pytest.param("qwen3", 1, marks=pytest.mark.slow)])
def test_greedy_equals_no_speculation(checkpoints, arch, page_size):
    """Prompts sharing a prefix (a radix hit), chunks of 16 tokens, run twice (the second time
    from the prefix cache)."""
    target, draft = checkpoints[arch]
    base = random_prompts(3, [20, 30, 25], VOCAB, seed=3)
    prompts = [p + p[:10] + p for p in base] + [base[0] * 2 + base[1]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    options = dict(page_size=page_size, max_prefill_tokens=16, max_num_batched_tokens=24)
    expected = [o.token_ids for o in make_llm(target, **options).generate(prompts, params)]
    llm = make_llm(target, eagle3_spec(draft), **options)
    hits = llm.scheduler.cache.num_hit_tokens
    for _ in range(2):
        assert [o.token_ids for o in llm.generate(prompts, params)] == expected
        llm.scheduler.check_integrity()
    assert llm.scheduler.cache.num_hit_tokens > hits
    stats = llm.scheduler.spec.stats
    assert stats.verify_steps > 10 and stats.draft_tokens > 3 * 10
    assert arch != "llama_echo" or stats.accepted_tokens > 4
    assert not llm.scheduler.spec.proposer.states  # every request's draft state was dropped
    llm.close()


def test_seeded_sampling_is_the_same_sequence(checkpoints):
    """Verified positions draw with the request's seed at their output index: a seeded sampled
    request gives the tokens (and log-probs) it gives without speculation."""
    target, draft = checkpoints["llama_echo"]
    base = random_prompts(3, [20, 30, 25], VOCAB, seed=6)
    prompts = [p + p[:10] + p for p in base]
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=11, max_tokens=30, ignore_eos=True,
                            logprobs=True, top_logprobs=2)
    expected = make_llm(target).generate(prompts, params)
    llm = make_llm(target, eagle3_spec(draft))
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    for o, e in zip(outs, expected):
        for x, y in zip(o.logprobs, e.logprobs):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
    assert llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


def test_retraction(checkpoints):
    """A pool too small for every request at once: retracted requests are re-fed, and the draft
    replaces its K/V from the first re-fed position on."""
    target, draft = checkpoints["llama_echo"]
    base = random_prompts(6, [20, 30, 25, 40, 18, 33], VOCAB, seed=5)
    prompts = [p + p[:10] + p for p in base]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    expected = [o.token_ids for o in make_llm(target).generate(prompts, params)]
    llm = make_llm(target, eagle3_spec(draft), num_pages=400)
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    llm.scheduler.check_integrity()
    assert llm.scheduler.num_retractions > 0 and llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


@pytest.mark.skipif(TEST_DEVICE == "cuda" and importlib.util.find_spec("fla") is None,
                    reason="hybrid models on CUDA need fla-core")
def test_hybrid_target(tmp_path):
    """A hybrid (Gated DeltaNet) target runs the shared decoder loop too: its captured streams
    feed the draft, and the verify steps keep their recurrent states exact."""
    from helpers.hybrid_models import make_hybrid_checkpoint

    target = make_hybrid_checkpoint("qwen3_5", tmp_path / "qwen3_5")
    draft = make_draft(tmp_path / "draft", target, seed=3)
    base = random_prompts(3, [20, 30, 25], VOCAB, seed=3)
    prompts = [p + p[:10] + p for p in base]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [o.token_ids for o in make_llm(target).generate(prompts, params)]
    llm = make_llm(target, eagle3_spec(draft))
    assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    llm.scheduler.check_integrity()
    assert llm.scheduler.spec.stats.verify_steps > 10
    llm.close()


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tp2(checkpoints, arch):
    """The draft is replicated: every rank drafts the same tokens from the same aux states
    (llama's through the target's vocabulary-parallel embedding)."""
    target, draft = checkpoints[arch]
    prompts = random_prompts(3, [20, 30, 25], VOCAB, seed=4)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = [o.token_ids for o in make_llm(target, num_pages=1024).generate(prompts, params)]
    llm = make_llm(target, eagle3_spec(draft), tp=2, num_pages=1024)
    try:
        assert [o.token_ids for o in llm.generate(prompts, params)] == expected
    finally:
        llm.close()
