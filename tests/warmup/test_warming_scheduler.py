"""Serving while the sampler's kernels still compile: a request that needs them is prefilled up to
its last token and samples once its stage is done, while the others run; a grammar compiles
beside its request's prefill and ahead of the first ``json_object`` request."""

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


def test_a_request_waits_for_its_sampler_stage_and_the_others_run(llm):
    s = llm.scheduler
    stages = Stages()
    s.warming.stages = stages
    try:
        prompt = llm.tokenizer.encode("The warm-up compiles the sampler's kernels meanwhile.")
        s.add_request(1, prompt, SamplingParams(temperature=0.7, seed=1, max_tokens=3))
        s.add_request(2, prompt[:5], SamplingParams(temperature=0, max_tokens=3))
        tokens = _run(s, lambda t: len(t.get(2, [])) == 3)
        assert len(tokens[2]) == 3 and 1 not in tokens  # greedy ran; sampled waits
        held = s.reqs[1]
        assert held.device_len == len(prompt) - 1  # prefilled up to the token that samples
        assert s.only_waiting  # the loop may sleep: nothing to step
        stages.stage = 1  # "sampled" compiled
        assert not s.only_waiting
        tokens = _run(s, lambda t: len(t.get(1, [])) == 3)
        assert len(tokens[1]) == 3 and not s.reqs
        s.check_integrity()
    finally:
        s.warming.stages = None


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
