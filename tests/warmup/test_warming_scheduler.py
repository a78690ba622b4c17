"""Serving while the sampler's kernels still compile: a batch with a row that needs them samples
on the torch reference (the same tokens) while the others keep the engine's sampler, and nobody
waits; a grammar compiles beside its request's prefill and ahead of the first ``json_object``
request."""

from __future__ import annotations

import time

import pytest

from minisgl.core import SamplingParams

pytestmark = pytest.mark.slow  # the default model on CPU


class Stages:
    """Stands in for the kernel warm-up (``minisgl.warmup.KernelWarmup``)."""

    def __init__(self) -> None:
        self.stage, self.done = 0, False


@pytest.fixture(scope="module")
def llm(default_model_dir):
    from minisgl import LLM

    with LLM(default_model_dir, warmup="off", max_running_requests=4) as llm:
        yield llm


def _run(scheduler, until, limit: int = 200) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    for _ in range(limit):
        for out in scheduler.step():
            if out.token is not None:
                tokens.setdefault(out.uid, []).append(out.token)
        if until(tokens):
            break
    for out in scheduler.drain():
        if out.token is not None:
            tokens.setdefault(out.uid, []).append(out.token)
    return tokens


def test_a_batch_whose_sampler_kernels_compile_samples_on_the_reference(llm):
    from minisgl.scheduler.warming import REFERENCE

    s = llm.scheduler
    stages = Stages()
    s.warming.stages = stages
    samplers: list[tuple[set[int], str | None]] = []  # each forward's requests and sampler
    forward = s.engine.forward

    def spy(batch, args):
        samplers.append(({f.req.uid for f in batch.feeds}, args.sampler))
        return forward(batch, args)

    s.engine.forward = spy
    try:
        prompt = llm.tokenizer.encode("The warm-up compiles the sampler's kernels meanwhile.")
        params = SamplingParams(temperature=0.7, seed=1, max_tokens=3)
        s.add_request(1, prompt, params)
        s.add_request(2, prompt[:5], SamplingParams(temperature=0, max_tokens=3))
        tokens = _run(s, lambda t: len(t.get(1, [])) == 3 and len(t.get(2, [])) == 3)
        assert len(tokens[1]) == 3 and len(tokens[2]) == 3 and not s.reqs  # nobody waited
        assert all(sampler == REFERENCE for uids, sampler in samplers if 1 in uids)
        assert samplers[0][0] == {1, 2}  # both prefilled at once, and sampled at once
        alone = [sampler for uids, sampler in samplers if uids == {2}]  # after 1 ended, if any
        assert all(sampler is None for sampler in alone)
        stages.done = True  # every stage compiled: the engine's sampler, the same tokens
        samplers.clear()
        s.add_request(3, prompt, params)
        again = _run(s, lambda t: len(t.get(3, [])) == 3)
        assert again[3] == tokens[1] and {sampler for _, sampler in samplers} == {None}
        s.check_integrity()
    finally:
        s.warming.stages = None
        del s.engine.forward


def test_a_grammar_compiles_beside_the_prefill_and_json_object_ahead(llm):
    from minisgl.scheduler.grammar import JSON_OBJECT

    s = llm.scheduler
    grammar = s.grammar
    grammar.prepare()  # the warm-up's call: the compiler and json_object, in the background
    deadline = time.monotonic() + 60
    while grammar._compiler is None or JSON_OBJECT not in grammar._compiler._cache:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    prompt = llm.tokenizer.encode("Give a JSON object with a name.")
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    s.add_request(3, prompt, SamplingParams(temperature=0, max_tokens=12, json_schema=schema))
    s.step()  # its prefill starts at once (short of the token that samples while it compiles)
    assert s.reqs[3].device_len > 0
    tokens = _run(s, lambda t: 3 in t and 3 not in s.reqs)
    assert tokens[3] and not s.reqs
    text = llm.tokenizer.decode(tokens[3])
    assert text.startswith("{")
