"""The warm-up plan: forwards capped by what the engine can run, every sampler switch, and the
stages the sampler compiles in after ready, with a request's place among them."""

from __future__ import annotations

from dataclasses import replace

from minisgl.core import SamplingParams
from minisgl.warmup.plan import (
    FEATURE_STAGES,
    ForwardShape,
    feature_stage,
    kernel_plan,
    request_features,
    sampler_cases,
)

ENGINE = dict(max_forward_tokens=8192, max_seq_len=40960, max_running_reqs=256, graph_max_bs=256,
              piecewise_max_tokens=4096, page_size=1, grammar=True)


def test_the_plan_is_deterministic_and_capped():
    plan = kernel_plan(**ENGINE)
    assert plan == kernel_plan(**ENGINE)
    prefills = [f for f in plan.forwards if f.extends and not f.decode and not f.prefix]
    lens = {f.extends[0] for f in prefills}
    assert {1, 16, 33, 97, 255, 4096, 4097, 8192} <= lens and max(lens) == 8192
    assert ForwardShape(extends=(37,), prefix=8192) in plan.forwards  # the chunk after a full one
    assert ForwardShape(extends=(45,), prefix=600) in plan.forwards  # a prefix hit
    assert any(f.decode and f.extends for f in plan.forwards)  # mixed steps
    # a decode batch beyond the graphs cannot exist: no more requests run than the graphs hold
    assert not any(f.decode and not f.extends for f in plan.forwards)
    small = kernel_plan(**{**ENGINE, "max_forward_tokens": 512, "max_seq_len": 300,
                           "max_running_reqs": 64, "graph_max_bs": 16})
    assert all(f.prefix + sum(f.extends) <= 300 for f in small.forwards)
    assert ForwardShape(decode=17) in small.forwards
    no_graphs = kernel_plan(**{**ENGINE, "graph_max_bs": 0})
    assert {f.decode for f in no_graphs.forwards if not f.extends} == {1, 2, 7, 33}
    paged = kernel_plan(**{**ENGINE, "page_size": 16})
    assert ForwardShape(extends=(45,), prefix=593) in paged.forwards  # off a page boundary


def test_sampler_cases_cover_every_switch_once():
    cases = sampler_cases(grammar=True)
    assert len(cases) == 32 and len({c.name for c in cases}) == 32
    assert len(sampler_cases(grammar=False)) == 16
    assert {c.stage for c in cases} == set(range(1, len(FEATURE_STAGES) + 1))
    last = [c for c in cases if c.stage == len(FEATURE_STAGES)]
    assert all("grammar" in c.features for c in last)


def test_a_request_needs_the_stages_of_its_features():
    greedy = SamplingParams(temperature=0)
    assert request_features(greedy) == frozenset() and feature_stage(frozenset()) == 0
    sampled = SamplingParams(temperature=0.7)
    assert request_features(sampled) == {"sampled"} and feature_stage({"sampled"}) == 1
    assert request_features(replace(greedy, logprobs=True)) == {"sampled", "logprobs"}
    top = replace(sampled, logprobs=True, top_logprobs=5)
    assert feature_stage(request_features(top)) == FEATURE_STAGES.index("top-logprobs") + 1
    penalised = replace(greedy, presence_penalty=0.5)  # greedy, but through the kernels
    assert request_features(penalised) == {"sampled", "penalties"}
    schema = replace(sampled, json_schema='{"type": "object"}')
    assert feature_stage(request_features(schema)) == len(FEATURE_STAGES)


def test_a_batch_samples_on_the_reference_while_a_rows_stage_compiles():
    from types import SimpleNamespace

    from minisgl.scheduler.warming import REFERENCE, WarmingGate

    stages = SimpleNamespace(stage=0, done=False)
    gate = WarmingGate(stages)
    greedy = SimpleNamespace(sampling_params=SamplingParams(temperature=0))
    sampled = SimpleNamespace(sampling_params=SamplingParams(temperature=0.7, top_logprobs=3,
                                                             logprobs=True))
    assert gate.sampler([greedy]) is None  # greedy is compiled before ready
    assert gate.sampler([greedy, sampled]) == REFERENCE  # one row is enough
    stages.stage = FEATURE_STAGES.index("top-logprobs")  # sampled and logprobs, not top
    assert gate.sampler([sampled]) == REFERENCE
    stages.stage += 1
    assert gate.sampler([greedy, sampled]) is None
    stages.stage, stages.done = 0, True
    assert gate.sampler([sampled]) is None and WarmingGate(None).sampler([sampled]) is None
