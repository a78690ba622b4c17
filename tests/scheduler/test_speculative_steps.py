"""The scheduler's speculative bookkeeping on CPU, with fabricated engine output
(``helpers/fake_target.py``: the real scheduler and cache, a scripted forward and proposer).

Each test puts the scheduler where a rule matters (drafts rejected, a step that verifies and
retracts, a verify step beside a prefill chunk, a stop inside an accepted run)
and asserts the rule: the output is the target's, whatever was drafted; only accepted tokens
stay in a request; the pages past its kept tokens go back; the allocator's integrity holds.
"""

from __future__ import annotations

import pytest

from helpers.fake_target import run, scripted_forward, scripted_llm, scripts
from helpers.hf_models import random_prompts
from minisgl import LLM, SamplingParams

PAGE = 4
K = 4


def make_llm(model, script, wrong=lambda uid, pos: False, **options) -> LLM:
    return scripted_llm(model, script, wrong, PAGE, K, **options)


def round_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def live(sched) -> list:
    return [r for r in sched.reqs.values() if r.table_idx >= 0]


@pytest.fixture(scope="module")
def llama(tiny_checkpoints):
    return tiny_checkpoints["llama"]


def test_rejected_drafts_leave_neither_tokens_nor_pages(llama):
    """Read back after every step (no overlap): a request's tokens are the target's, and it holds
    the pages of its fed tokens and no more, however many of its drafts were rejected."""
    prompts = random_prompts(3, [9, 13, 6], 200, seed=1)
    script = scripts(prompts, 30)
    llm = make_llm(llama, script, wrong=lambda uid, pos: pos % 5 == 0, disable_overlap=True)
    sched = llm.scheduler
    cache = sched.cache

    def rules() -> None:
        for req in sched.reqs.values():
            assert req.input_ids == script[req.uid][: len(req.input_ids)]
            assert req.device_len <= len(req.input_ids)
        used = cache.num_tokens - cache.available_tokens
        assert used == sum(round_up(r.device_len) for r in live(sched))
        sched.check_integrity()

    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    scripted_forward(sched, script)
    tokens = run(sched, prompts, params, rules)
    assert tokens == {uid: s[len(prompts[uid]):] for uid, s in script.items()}
    stats = sched.spec.stats
    assert stats.verify_steps > 0 and 0 < stats.accepted_tokens < stats.draft_tokens
    assert cache.available_tokens == cache.num_tokens
    llm.close()


def test_a_step_that_verifies_and_retracts(llama):
    """A pool too small for every request: steps that verify drafts also retract requests. The
    retracted ones re-feed what they have and still give the target's tokens."""
    prompts = random_prompts(4, [10, 12, 9, 11], 200, seed=2)
    script = scripts(prompts, 40)
    llm = make_llm(llama, script, wrong=lambda uid, pos: pos % 7 == 0, num_pages=26,
                   max_seq_len=64)
    sched = llm.scheduler
    launched = scripted_forward(sched, script)
    both = []  # steps that retracted a request and verified another's drafts
    retractions = [0]

    def after() -> None:
        sched.check_integrity()
        if sched.num_retractions > retractions[0] and launched and any(
                len(p) > 1 for p in launched[-1].values()):
            both.append(len(launched))
        retractions[0] = sched.num_retractions

    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tokens = run(sched, prompts, params, after)
    assert tokens == {uid: s[len(prompts[uid]):] for uid, s in script.items()}
    assert sched.num_retractions > 0 and both
    assert sched.cache.available_tokens == sched.cache.num_tokens
    llm.close()


def test_a_verify_step_beside_a_prefill_chunk(llama):
    """A prompt that arrives while others speculate is fed in the same step as their drafts
    (which then extend like prefill chunks): everyone still gets the target's tokens."""
    prompts = random_prompts(3, [8, 10, 40], 200, seed=3)
    script = scripts(prompts, 24)
    llm = make_llm(llama, script, wrong=lambda uid, pos: pos % 6 == 0, max_prefill_tokens=8)
    sched = llm.scheduler
    phases = []
    forward = scripted_forward(sched, script)
    engine_forward = sched.engine.forward

    def spy(batch, args):
        out = engine_forward(batch, args)
        phases.append((batch.phase, any(len(p) > 1 for p in forward[-1].values())))
        return out

    sched.engine.forward = spy
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for uid, prompt in enumerate(prompts[:2]):
        sched.add_request(uid, prompt, params)
    tokens: dict[int, list[int]] = {}
    steps = 0
    while sched.has_work:
        if steps == 6:
            sched.add_request(2, prompts[2], params)
        for out in sched.step():
            tokens.setdefault(out.uid, []).append(out.token)
        sched.check_integrity()
        steps += 1
    assert tokens == {uid: s[len(prompts[uid]):] for uid, s in script.items()}
    assert ("mixed", True) in phases or ("prefill", True) in phases
    assert ("decode", True) in phases  # alone, the verify steps run as decode rows
    llm.close()


def test_drafts_follow_accepted_tokens_only(llama):
    """Under overlap a step that drafts reads the forward in flight back first, and a verify step
    is read back before the next step is planned: a proposer is only ever shown accepted tokens
    (no draft, no guess of a bonus token still being computed), wrong drafts or not."""
    prompts = random_prompts(2, [9, 12], 200, seed=4)
    script = scripts(prompts, 40)
    llm = make_llm(llama, script, wrong=lambda uid, pos: pos % 9 == 0)
    sched = llm.scheduler
    shown = []
    proposer = sched.spec.proposer
    propose = proposer.propose
    proposer.propose = lambda req, n: (shown.append(list(req.input_ids)), propose(req, n))[1]
    scripted_forward(sched, script)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tokens = run(sched, prompts, params, sched.check_integrity)
    assert tokens == {uid: s[len(prompts[uid]):] for uid, s in script.items()}
    assert len(shown) > 10
    assert all(ids == script[uid][: len(ids)] for ids in shown
               for uid in [next(u for u, p in enumerate(prompts) if ids[: len(p)] == p)])
    assert sched.cache.available_tokens == sched.cache.num_tokens
    llm.close()


def test_stops_inside_an_accepted_run_keep_no_pages_past_them(llama):
    """A stop token inside a run of accepted drafts ends the request there; the KV of the
    positions after it goes back with the rest (nothing past the stop reaches the cache)."""
    prompts = random_prompts(1, [12], 200, seed=5)
    script = scripts(prompts, 30)
    stop = script[0][12 + 8]  # the 9th output token: inside the second run of K + 1
    llm = make_llm(llama, script, disable_overlap=True)
    sched = llm.scheduler
    scripted_forward(sched, script)
    params = SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop])
    tokens = run(sched, prompts, params, sched.check_integrity)
    first = script[0][12:].index(stop)
    assert tokens[0] == script[0][12 : 12 + first + 1]
    assert sched.cache.available_tokens == sched.cache.num_tokens
    llm.close()
