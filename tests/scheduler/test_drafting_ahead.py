"""Drafting ahead (``scheduler/ahead.py``) on CPU with fabricated engine output
(``helpers/fake_target.py``): the step after a verify step in flight is drafted as if that step
kept all its drafts, and dropped for a request that rejected one.

Each test puts the scheduler where a rule matters (every draft accepted, a rejection while a step
drafted ahead is in flight, a request that ends inside the step in flight, retraction) and asserts
it: the output is the target's and the same as synchronous scheduling's; a dropped step leaves
neither tokens nor pages; the allocator's integrity holds after every step.
"""

from __future__ import annotations

import pytest

from helpers.fake_target import ScriptProposer, run, scripted_forward, scripted_llm, scripts
from helpers.hf_models import random_prompts
from minisgl import LLM, SamplingParams
from minisgl.speculative import create_spec_decoder, parse_speculative_config

PAGE = 4
K = 4


def make_llm(model, script, wrong=lambda uid, pos: False, **options) -> LLM:
    llm = scripted_llm(model, script, wrong, PAGE, K, lookahead=True, **options)
    scripted_forward(llm.scheduler, script)
    return llm


def checked(sched, script):
    """After every step: each request holds the target's tokens and no more than it fed, and the
    allocator accounts for every page."""

    def rules() -> None:
        for req in sched.reqs.values():
            assert req.input_ids == script[req.uid][: len(req.input_ids)]
            assert req.device_len <= len(req.input_ids)
        sched.check_integrity()

    return rules


def generate(model, prompts, script, params, **options) -> tuple[dict, LLM]:
    llm = make_llm(model, script, **options)
    sched = llm.scheduler
    tokens = run(sched, prompts, params, checked(sched, script))
    assert sched.cache.available_tokens == sched.cache.num_tokens
    return tokens, llm


@pytest.fixture(scope="module")
def llama(tiny_checkpoints):
    return tiny_checkpoints["llama"]


def test_all_accepted_every_step_is_drafted_ahead(llama):
    """Drafts always right: after the first verify step every step is drafted on the one in
    flight, and none is dropped."""
    prompts = random_prompts(2, [9, 13], 200, seed=11)
    script = scripts(prompts, 40)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tokens, llm = generate(llama, prompts, script, params)
    assert tokens == {uid: s[len(prompts[uid]):] for uid, s in script.items()}
    stats = llm.scheduler.spec.stats
    assert stats.ahead_feeds >= stats.verify_steps - 2 * len(prompts) > 0
    assert stats.ahead_dropped == 0
    llm.close()


def test_a_rejection_drops_the_step_drafted_ahead(llama):
    """Drafts wrong now and then: the step drafted on a verify step that rejects one is dropped
    for that request, which goes on from its kept tokens; the output is synchronous
    scheduling's."""
    prompts = random_prompts(2, [10, 7], 200, seed=12)
    script = scripts(prompts, 50)
    wrong = lambda uid, pos: (pos + uid) % 6 == 0  # noqa: E731
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    ahead, llm = generate(llama, prompts, script, params, wrong=wrong)
    stats = llm.scheduler.spec.stats
    assert stats.ahead_feeds > stats.ahead_dropped > 0
    llm.close()
    sync, llm = generate(llama, prompts, script, params, wrong=wrong, disable_overlap=True)
    assert llm.scheduler.spec.stats.ahead_feeds == 0
    llm.close()
    assert ahead == sync == {uid: s[len(prompts[uid]):] for uid, s in script.items()}


@pytest.mark.parametrize("end", ["stop", "length"])
def test_a_request_ending_inside_a_step_in_flight(llama, end):
    """A request that ends inside an accepted run while a step was drafted ahead on it (a stop
    token): that step's part is dropped, and its pages go back with the rest. One that reaches its
    length there had no step drafted past its end."""
    prompts = random_prompts(2, [12, 8], 200, seed=13)
    script = scripts(prompts, 40)
    if end == "stop":
        stop = script[0][12 + 13]  # inside a run of K + 1, after a few steps drafted ahead
        params = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop])
        first = script[0][12:].index(stop)
    else:
        params = SamplingParams(temperature=0, max_tokens=23, ignore_eos=True)
        first = 22
    tokens, llm = generate(llama, prompts, script, params)
    assert tokens[0] == script[0][12 : 12 + first + 1]
    stats = llm.scheduler.spec.stats
    assert stats.ahead_feeds > 0 and (stats.ahead_dropped > 0) == (end == "stop")
    llm.close()


def test_drafting_ahead_beside_retraction(llama):
    """A pool too small for every request: steps retract requests (planned after a read-back,
    never ahead), others are drafted ahead when there is room; the retracted ones re-feed what
    they have and still give the target's tokens."""
    prompts = random_prompts(4, [10, 12, 9, 11], 200, seed=14)
    script = scripts(prompts, 40)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tokens, llm = generate(llama, prompts, script, params, wrong=lambda uid, pos: pos % 7 == 0,
                           num_pages=26, max_seq_len=64)
    assert tokens == {uid: s[len(prompts[uid]):] for uid, s in script.items()}
    assert llm.scheduler.num_retractions > 0
    assert llm.scheduler.spec.stats.ahead_feeds > 0
    llm.close()


def test_a_swapped_decoder_drafts_ahead_too(llama):
    """The benchmarks swap the scheduler's decoder between runs (``sched.spec = ...``): the steps
    drafted ahead use the one in place, never the one the scheduler was built with."""
    prompts = random_prompts(2, [9, 11], 200, seed=15)
    script = scripts(prompts, 40)
    llm = make_llm(llama, script)
    sched, built = llm.scheduler, llm.scheduler.spec
    swapped = create_spec_decoder(parse_speculative_config(
        {"method": "ngram", "num_speculative_tokens": K, "adaptive": False}), sched.engine)
    assert swapped is not None
    swapped.proposer = ScriptProposer(script, lambda uid, pos: pos % 5 == 0, lookahead=True)
    sched.spec = swapped
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tokens = run(sched, prompts, params, checked(sched, script))
    assert tokens == {uid: s[len(prompts[uid]):] for uid, s in script.items()}
    assert swapped.stats.ahead_feeds > swapped.stats.ahead_dropped > 0
    assert built.stats.ahead_feeds == built.stats.verify_steps == 0
    llm.close()
