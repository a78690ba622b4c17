"""Penalties and logit_bias through the engine: device-side counts against a host reference loop,
the same tokens with overlap scheduling on and off and across retractions."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from helpers.device import TEST_DEVICE
from helpers.hf_models import hf_model, random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device
VOCAB = 256
PENALTIES = dict(presence_penalty=1.5, frequency_penalty=0.5, repetition_penalty=1.3)


def make_llm(model, **options):
    return LLM(model, device=TEST_DEVICE, dtype="float32", **options)


@pytest.fixture(scope="module")
def llama(tiny_checkpoints):
    return str(tiny_checkpoints["llama"])


def reference_greedy(path: str, prompt: list[int], n: int, presence: float, frequency: float,
                     repetition: float) -> list[int]:
    """Penalised greedy decoding by the definitions, host counters rebuilt at every step."""
    model = hf_model(path)
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        seen = set(ids)
        out = Counter(ids[len(prompt):])
        for t in seen:
            logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
        for t, c in out.items():
            logits[t] -= frequency * c + presence
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def test_penalised_greedy_matches_a_host_reference(llama):
    prompts = random_prompts(3, [9, 14, 6], VOCAB, seed=11)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **PENALTIES)
    plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = make_llm(llama, num_pages=1024)
    outs = llm.generate(prompts + prompts[:1], [params] * 3 + [plain])
    for prompt, out in zip(prompts, outs):
        want = reference_greedy(llama, prompt, 12, PENALTIES["presence_penalty"],
                                PENALTIES["frequency_penalty"], PENALTIES["repetition_penalty"])
        assert out.token_ids == want
    assert outs[3].token_ids != outs[0].token_ids  # the penalties changed something


@pytest.mark.parametrize("overlap", [True, False])
def test_penalised_sampling_is_the_same_with_overlap_and_retractions(llama, overlap):
    prompts = random_prompts(6, [20, 25, 30, 18, 22, 27], VOCAB, seed=5)
    params = [SamplingParams(temperature=0.9, top_k=20, top_p=0.95, seed=i, max_tokens=24,
                             ignore_eos=True, **(PENALTIES if i % 2 == 0 else {}))
              for i in range(6)]
    roomy = make_llm(llama, num_pages=4096, disable_overlap=True)
    expected = [o.token_ids for o in roomy.generate(prompts, params)]
    tight = make_llm(llama, num_pages=150, disable_overlap=not overlap)
    assert [o.token_ids for o in tight.generate(prompts, params)] == expected
    assert tight.scheduler.num_retractions > 0
    unpenalised = [o.token_ids for o in roomy.generate(
        prompts[:1], SamplingParams(temperature=0.9, top_k=20, top_p=0.95, seed=0, max_tokens=24,
                                    ignore_eos=True))]
    assert unpenalised[0] != expected[0]


def test_logit_bias_bans_and_forces_tokens(llama):
    prompts = random_prompts(2, [10, 12], VOCAB, seed=3)
    llm = make_llm(llama, num_pages=1024)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    base = llm.generate(prompts, greedy)
    banned = base[0].token_ids[0]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True,
                                                logit_bias={banned: -100}))
    assert banned not in outs[0].token_ids and banned not in outs[1].token_ids
    forced = llm.generate(prompts, [
        SamplingParams(temperature=1.0, seed=s, max_tokens=8, ignore_eos=True,
                       logit_bias={"77": 100})
        for s in range(2)])
    assert all(o.token_ids == [77] * 8 for o in forced)
    # a biased request leaves its neighbours in the batch untouched
    mixed = llm.generate(prompts, [greedy, SamplingParams(temperature=0, max_tokens=8,
                                                          ignore_eos=True, logit_bias={77: 100})])
    assert mixed[0].token_ids == base[0].token_ids and mixed[1].token_ids == [77] * 8


def test_logit_bias_outside_the_vocabulary_is_a_value_error(llama):
    llm = make_llm(llama, num_pages=256)
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2, logit_bias={VOCAB + 5: 1.0}))
