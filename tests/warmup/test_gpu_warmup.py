"""On the GPU: a variant compiled from its record is the very one the launch uses, and after the
kernel warm-up no request of any kind compiles a kernel (Qwen3-0.6B's shapes, random weights)."""

from __future__ import annotations

import json
import sys
import threading

import pytest
import torch

from minisgl.core import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture
def compiles():
    """The kernels Triton compiles (or loads from its disk cache) from now on, on the test's
    own thread (the warm-up's compile threads aside)."""
    from triton import knobs

    seen: list[str] = []

    def hook(**kw):
        if threading.current_thread() is threading.main_thread():
            seen.append(kw["fn"].name)

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield seen
    finally:
        knobs.runtime.jit_post_compile_hook = None


def test_a_compiled_record_is_the_launchs_variant(compiles):
    from minisgl.kernel.triton.norm import rms_norm
    from minisgl.warmup.variants import record_launches

    x = torch.randn(37, 2, 200, dtype=torch.bfloat16, device="cuda")[:, 1]  # a strided view
    w = torch.randn(200, dtype=torch.bfloat16, device="cuda")
    with record_launches() as rec:
        rms_norm(x, w, 1e-6, pdl=True)
    (variant,) = rec.variants
    variant.compile()
    assert compiles == ["_rmsnorm_kernel"]
    rms_norm(x, w, 1e-6, pdl=True)  # the launch finds the variant compiled
    assert compiles == ["_rmsnorm_kernel"]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    sys.path.insert(0, "benchmark/online")
    from dummy_model import write_dummy_model

    return write_dummy_model("benchmark/configs/qwen3-0.6b.json",
                             str(tmp_path_factory.mktemp("qwen3-0.6b")))


def test_no_request_compiles_after_the_warm_up(qwen3_dir, tmp_path, compiles):
    from minisgl import LLM

    with LLM(qwen3_dir, dummy_weights=True, cache_dir=str(tmp_path), max_running_requests=64,
             cuda_graph_max_bs=32, max_seq_len=4096) as llm:
        kernels = llm.scheduler.kernels
        assert kernels is not None and kernels.wait_all(600) and not kernels.errors
        assert kernels.kernels is not None and not kernels.kernels.failed
        # loading, memory profiling, graph capture and the greedy warm-up compiled nothing
        assert compiles == [], f"compiled while starting: {sorted(set(compiles))}"
        prompt = list(range(100, 400))
        kinds = [
            SamplingParams(temperature=0, max_tokens=8),
            SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=1, max_tokens=8),
            SamplingParams(temperature=0.7, presence_penalty=0.5, logprobs=True, top_logprobs=3,
                           seed=2, max_tokens=8),
            SamplingParams(temperature=0, logit_bias={5: 1.0}, logprobs=True, top_logprobs=20,
                           max_tokens=8),
            SamplingParams(temperature=0, max_tokens=8, json_schema=json.dumps(
                {"type": "object", "properties": {"n": {"type": "integer"}}})),
        ]
        for params in kinds:  # each alone, then all together (the union of their switches)
            llm.generate([prompt], params)
        llm.generate([prompt] * len(kinds), kinds)
        llm.generate([list(range(7, 7 + n)) for n in (1, 17, 700, 2100)],
                     SamplingParams(temperature=0, max_tokens=3))
        assert compiles == [], f"compiled on the request path: {sorted(set(compiles))}"
    plans = list(tmp_path.glob("*/plans/*.json"))
    assert any(not p.name.endswith(".config.json") for p in plans)  # the plan, for a restart


def test_a_restart_reads_the_activation_peaks_instead_of_measuring(qwen3_dir, tmp_path,
                                                                     monkeypatch):
    """The second start on a cache sizes its KV pool from the peaks the first measured (no
    profiling forward runs) and gets the same pool."""
    from minisgl import LLM
    from minisgl.engine import memory

    options = dict(dummy_weights=True, cache_dir=str(tmp_path), max_running_requests=16,
                   cuda_graph_max_bs=8, max_seq_len=2048)
    with LLM(qwen3_dir, **options) as llm:
        first = llm.scheduler.engine.num_pages
    assert len(list(tmp_path.glob("*/plans/*.peaks.json"))) == 1

    def measured(engine):
        raise AssertionError("the forward was profiled again")

    monkeypatch.setattr(memory, "profile_forward", measured)
    with LLM(qwen3_dir, **options) as llm:
        assert llm.scheduler.engine.num_pages == first  # total memory x fraction - the peaks


def test_while_the_sampler_compiles_a_batch_samples_on_the_reference(qwen3_dir):
    """A batch with a row whose sampler stage still compiles takes the torch reference
    (``scheduler/warming.py``): the same tokens and log-probs as the Triton sampler's."""
    from types import SimpleNamespace

    from minisgl import LLM
    from minisgl.scheduler.warming import REFERENCE

    kinds = [SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=1, max_tokens=8),
             SamplingParams(temperature=0.7, presence_penalty=0.5, logprobs=True, top_logprobs=3,
                            seed=2, max_tokens=8),
             SamplingParams(temperature=0, max_tokens=8)]
    prompts = [list(range(100 + 7 * i, 300 + 7 * i)) for i in range(len(kinds))]
    with LLM(qwen3_dir, dummy_weights=True, warmup="off", cache="naive", max_running_requests=8,
             cuda_graph_max_bs=8, max_seq_len=1024) as llm:
        s = llm.scheduler
        want = llm.generate(prompts, kinds)  # the engine's own (Triton) sampler
        samplers: list[str | None] = []
        forward = s.engine.forward
        s.engine.forward = lambda batch, args: samplers.append(args.sampler) or forward(batch, args)
        s.warming.stages = SimpleNamespace(stage=0, done=False)  # nothing compiled yet
        try:
            got = llm.generate(prompts, kinds)
        finally:
            s.warming.stages = None
            del s.engine.forward
    assert samplers and set(samplers) == {REFERENCE}  # every batch held a sampled row
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for g, w in zip(got[1].logprobs, want[1].logprobs):
        assert g.token_id == w.token_id and abs(g.logprob - w.logprob) < 1e-3
