"""Exactness against Hugging Face transformers (float32, CPU) for every architecture.

Each tiny checkpoint has every parameter perturbed, so a dropped or misplaced weight changes the
output. Greedy tokens must be identical and logits within 1e-3, under several engine settings.
"""

from __future__ import annotations

import pytest
import torch

from helpers.device import GPU_TEST_OPTIONS, TEST_DEVICE
from helpers.engine_utils import prefill_logits, record_sampled_logits
from helpers.hf_models import ARCHS, hf_greedy, hf_model, hf_prefill_logits, random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device
VOCAB = 256
LENGTHS = [5, 17, 33, 60]
NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)

SETTINGS = {
    "page1": dict(page_size=1),
    "page4": dict(page_size=4),
    "chunked": dict(page_size=1, max_prefill_tokens=16),
    "chunked_page4": dict(page_size=4, max_prefill_tokens=13),
    "naive": dict(page_size=4, cache="naive"),
    "no_overlap": dict(page_size=1, max_prefill_tokens=16, disable_overlap=True),
    # mixed steps: decode rows next to prefill chunks of at most 20 - running tokens
    "mixed_small_budget": dict(page_size=4, max_prefill_tokens=16, max_num_batched_tokens=20),
    "prefill_first": dict(page_size=1, max_prefill_tokens=16, schedule_mode="prefill-first"),
}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(len(LENGTHS), LENGTHS, VOCAB, seed=0)


@pytest.fixture(scope="module")
def reference(tiny_checkpoints, prompts):
    return {arch: hf_greedy(tiny_checkpoints[arch], prompts, NEW_TOKENS) for arch in ARCHS}


def make_llm(path, **options) -> LLM:
    pages = 2048 // options.get("page_size", 1)
    return LLM(str(path), device=TEST_DEVICE, dtype="float32", num_pages=pages,
               **{**GPU_TEST_OPTIONS, **options})


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(arch, setting, tiny_checkpoints, prompts, reference):
    llm = make_llm(tiny_checkpoints[arch], **SETTINGS[setting])
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == reference[arch]
    assert all(o.finish_reason == "length" for o in outputs)
    llm.scheduler.check_integrity()


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_decode_logits_match_transformers(arch, tiny_checkpoints, prompts):
    """All positions of a batched prefill, then the sampled rows of every decode step."""
    path = tiny_checkpoints[arch]
    llm = make_llm(path, page_size=4)
    engine = llm.scheduler.engine
    logits = prefill_logits(llm.scheduler, prompts)
    expected = torch.cat(hf_prefill_logits(path, prompts))
    torch.testing.assert_close(logits.cpu(), expected, atol=1e-3, rtol=0)

    recorded = record_sampled_logits(engine)
    outputs = llm.generate(prompts, GREEDY)
    model = hf_model(path)
    # the LLM numbers requests 0, 1, ...
    for uid, (out, prompt) in enumerate(zip(outputs, prompts)):
        seq = torch.tensor([prompt + out.token_ids[:-1]])
        with torch.no_grad():
            ref = model(seq).logits[0, len(prompt) - 1 :]
        torch.testing.assert_close(torch.stack(recorded[uid]).cpu(), ref, atol=1e-3, rtol=0)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_radix_cache_hit_gives_same_tokens(arch, page_size, tiny_checkpoints):
    path = tiny_checkpoints[arch]
    shared = random_prompts(1, [42], VOCAB, seed=1)[0]
    tails = random_prompts(3, [3, 9, 14], VOCAB, seed=2)
    prompts = [shared + t for t in tails]
    expected = hf_greedy(path, prompts, NEW_TOKENS)
    llm = make_llm(path, page_size=page_size, cache="radix")
    first = llm.generate(prompts[:1], GREEDY)
    assert llm.scheduler.cache.num_hit_tokens == 0
    rest = llm.generate(prompts[1:], GREEDY)
    hit_per_req = len(shared) // page_size * page_size
    assert llm.scheduler.cache.num_hit_tokens >= 2 * hit_per_req
    assert [o.token_ids for o in first + rest] == expected
    llm.scheduler.check_integrity()


def test_naive_cache_never_hits(tiny_checkpoints):
    llm = make_llm(tiny_checkpoints["llama"], cache="naive")
    prompt = random_prompts(1, [30], VOCAB, seed=3)[0]
    a, b = llm.generate([prompt, prompt], GREEDY)
    assert a.token_ids == b.token_ids
    assert llm.scheduler.cache.num_hit_tokens == 0
