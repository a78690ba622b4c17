"""The warm-up plan reaches every sampler path and each size class, and runs to the end through the
real scheduler, leaving the pool whole and nothing counted as a prefix-cache hit."""

import pytest

from minisgl.core import SamplingParams
from minisgl.scheduler.warmup import run_warmup, sampler_variants, warmup_plan

PLAN = dict(vocab_size=1000, max_context_len=2048, max_prefill_tokens=512, max_running_reqs=64,
            graph_max_bs=16, grammar=True)


def test_cuda_plan_covers_sizes_paths_and_eager_decode():
    waves = warmup_plan(cuda=True, **PLAN)
    names = [w.name for w in waves]
    lens = {len(ids) for w in waves for _, ids, _ in w.requests}
    assert {1, 16, 33, 97, 255, 300} <= lens  # the FP8 and tile thresholds on both sides
    assert max(lens) == 2048 - 25  # capped by the context, and chunked (> max_prefill_tokens)
    assert all(len(ids) < 2048 for w in waves for _, ids, _ in w.requests)
    big = waves[names.index("decode beyond the graphs")]
    assert len(big.requests) == 17  # one more than the largest graph
    for name in sampler_variants(SamplingParams(), grammar=True):
        assert f"sampler {name}" in names
    hit = waves[names.index("prefix hit")]
    first, second = hit.requests[0][1], hit.requests[1][1]
    assert second[:len(first)] == first and second[0] == first[0]
    mixed = waves[names.index("mixed steps")]
    assert sorted({after for after, _, _ in mixed.requests}) == [0, 2, 5, 8]
    assert all(0 <= t < 1000 for w in waves for _, ids, _ in w.requests for t in ids)


def test_cpu_plan_is_one_wave_of_every_sampler_path():
    waves = warmup_plan(cuda=False, **PLAN)
    assert [w.name for w in waves] == ["sampler paths together"]
    params = [p for _, _, p in waves[0].requests]
    assert any(p.json_schema for p in params) and any(p.prompt_logprobs for p in params)
    assert any(p.presence_penalty for p in params) and any(p.logit_bias for p in params)


def test_no_eager_decode_wave_when_the_graphs_cover_every_batch():
    waves = warmup_plan(cuda=True, **{**PLAN, "graph_max_bs": 64})
    assert "decode beyond the graphs" not in [w.name for w in waves]


@pytest.mark.slow
def test_runs_through_the_real_scheduler():
    from minisgl import LLM

    with LLM(warmup="off", max_running_requests=8) as llm:
        sched = llm.scheduler
        waves = warmup_plan(vocab_size=sched.engine.vocab_size,
                            max_context_len=sched.max_context_len, max_prefill_tokens=64,
                            max_running_reqs=8, graph_max_bs=0, cuda=False, grammar=True)
        seconds = run_warmup(sched, waves)
        assert seconds > 0 and not sched.has_work and not sched.reqs
        sched.check_integrity()
        assert sched.cache.num_hit_tokens == 0
        out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4))
        assert out[0].finish_reason == "length" and len(out[0].token_ids) == 4


def test_warmup_option_resolves_by_device(default_model_dir):
    from minisgl.llm.config import EngineOptions

    def resolved(**kw) -> bool:
        return EngineOptions(device="cpu", **kw).scheduler_config(default_model_dir, ()).warmup

    assert not resolved() and resolved(warmup="on") and not resolved(warmup="off")
    with pytest.raises(ValueError, match="warmup"):
        EngineOptions(warmup="yes")


def test_every_prompt_fits_a_short_context():
    waves = warmup_plan(cuda=True, **{**PLAN, "max_context_len": 512})
    assert max(len(ids) + p.max_tokens for w in waves for _, ids, p in w.requests) <= 512


def test_the_reference_wave_runs_every_feature_while_the_kernels_compile():
    def sampler_waves(**kw):
        return [w for w in warmup_plan(cuda=True, sampler=False, **PLAN, **kw)
                if w.name.startswith("sampler")]

    assert sampler_waves() == []  # the kernels are compiled: nothing samples on the reference
    (wave,) = sampler_waves(reference=True)
    (_, _, params), = wave.requests
    assert wave.name == "sampler reference" and params.temperature > 0
    assert params.presence_penalty and params.repetition_penalty != 1 and params.logit_bias
    assert params.logprobs and params.top_logprobs and params.json_schema is not None
    (wave,) = [w for w in warmup_plan(cuda=True, sampler=False, reference=True,
                                      **{**PLAN, "grammar": False})  # no tokenizer
               if w.name.startswith("sampler")]
    assert wave.requests[0][2].json_schema is None
