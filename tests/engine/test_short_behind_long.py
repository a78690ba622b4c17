"""A short prompt that arrives while a long one is being prefilled in chunks shares the steps
with it (the long one yields half of each step to a shorter prompt behind it), so its first token
comes within a few steps instead of after every chunk of the long prompt; the outputs are those
of each request alone (the real scheduler and engine, a tiny model, CPU)."""

from __future__ import annotations

import pytest

from helpers.device import TEST_DEVICE
from helpers.hf_models import random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
BUDGET = 32


@pytest.fixture(scope="module")
def llm(tiny_checkpoints):
    return LLM(str(tiny_checkpoints["llama"]), device=TEST_DEVICE, dtype="float32",
               num_pages=4096, max_prefill_tokens=BUDGET, max_num_batched_tokens=BUDGET)


def steps_to_first_token(llm: LLM, long: list[int], short: list[int], arrive_at: int):
    """Feed ``long``, add ``short`` after ``arrive_at`` steps; the steps from the short request's
    arrival to its first token, and every request's tokens."""
    sched = llm.scheduler
    sched.add_request(0, long, GREEDY)
    tokens: dict[int, list[int]] = {}
    step, first = 0, None
    while sched.has_work:
        if step == arrive_at:
            sched.add_request(1, short, GREEDY)
        outs = sched.step() if sched.reqs else sched.drain()
        for o in outs:
            tokens.setdefault(o.uid, []).append(o.token)
            if o.uid == 1 and first is None:
                first = step - arrive_at
        step += 1
    sched.check_integrity()
    return first, tokens


def test_short_prompt_gets_its_first_token_within_a_few_steps(llm):
    long, short = random_prompts(2, [480, 40], 256, seed=3)
    first, tokens = steps_to_first_token(llm, long, short, arrive_at=2)
    # the long prompt has 480 - 2 * 32 = 416 tokens (13 steps) left when the short one arrives;
    # sharing the steps, the short one's 40 tokens take 16 + 16 + 8: its token comes with the
    # third step's forward, read back one step later under overlap
    assert first is not None and first <= 4
    alone = {uid: [o.token_ids for o in llm.generate([p], GREEDY)][0]
             for uid, p in ((0, long), (1, short))}
    assert tokens == alone


def test_prompts_of_equal_length_do_not_share(llm):
    """Behind a prompt as long as itself, a chunked prompt keeps the whole step: the first one's
    first token is not delayed by the second."""
    a, b = random_prompts(2, [200, 200], 256, seed=4)
    sched = llm.scheduler
    sched.add_request(0, a, GREEDY)
    sched.add_request(1, b, GREEDY)
    batch = sched.planner.plan().batch
    assert [r.uid for r in batch.feeds] == [0] and batch.feeds[0].device_len == BUDGET
    while sched.has_work:
        sched.step() if sched.reqs else sched.drain()


def test_without_yielding_the_short_prompt_waits_for_every_chunk(tiny_checkpoints):
    """``--disable-prefill-yield`` (the ablation the TTFT benchmark compares against): the long
    prompt keeps every step, and the short one's first token comes only after its last chunk."""
    llm = LLM(str(tiny_checkpoints["llama"]), device=TEST_DEVICE, dtype="float32",
              num_pages=4096, max_prefill_tokens=BUDGET, max_num_batched_tokens=BUDGET,
              disable_prefill_yield=True)
    long, short = random_prompts(2, [480, 40], 256, seed=3)
    first, tokens = steps_to_first_token(llm, long, short, arrive_at=2)
    # 416 tokens of the long prompt (13 steps) go first, then the short one's 40 (2 steps)
    assert first is not None and first >= 14
    assert tokens[1] == [o.token_ids for o in llm.generate([short], GREEDY)][0]


def test_prefill_tokens_are_counted_as_the_chunks_are_fed(llm):
    """The live log's prefill rate (``PrefillManager.fed_tokens``) advances with each chunk of a
    long prompt, before its first token; a prefix-cache hit is not computed, so not counted."""
    (prompt,) = random_prompts(1, [100], 256, seed=5)
    sched = llm.scheduler
    start = sched.prefill.fed_tokens
    sched.add_request(0, prompt, GREEDY)
    fed = []
    for _ in range(3):
        assert not [o for o in sched.step() if o.token is not None]  # still prefilling
        fed.append(sched.prefill.fed_tokens - start)
    assert fed == [BUDGET, 2 * BUDGET, 3 * BUDGET]
    while sched.has_work:
        sched.step() if sched.reqs else sched.drain()
    assert sched.prefill.fed_tokens - start == 100
    sched.add_request(1, prompt + [7, 8], GREEDY)  # the first 100 tokens are cached
    while sched.has_work:
        sched.step() if sched.reqs else sched.drain()
    assert 100 < sched.prefill.fed_tokens - start <= 100 + 3
