"""Mixed steps and admission order, on the real scheduler and engine (tiny models, CPU).

A step with running requests carries every one of their decode tokens next to prefill chunks under
``max_num_batched_tokens``, so a burst of long prompts never pauses a stream for more than one step;
greedy outputs equal those of ``prefill-first`` (the former order, kept as an ablation). ``lpm``
admits the longest cached prefix first and still admits everyone within ``max_wait_steps``.
"""

from __future__ import annotations

import json
import os

import pytest

from helpers.device import TEST_DEVICE
from helpers.hf_models import ARCHS, random_prompts
from minisgl import LLM, SamplingParams
from minisgl.core import Batch
from minisgl.llm.config import EngineOptions

pytestmark = pytest.mark.any_device
VOCAB = 256
STREAM = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
SHORT = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def make_llm(model, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(str(model), device=TEST_DEVICE, dtype="float32", **options)


def record_steps(scheduler) -> list[tuple[Batch | None, list, bool]]:
    """Per scheduled step: (batch, the running requests that needed a token, whether it
    retracted)."""
    steps = []
    plan = scheduler.planner.plan

    def spy(drafter=None):
        due = [r for r in scheduler.decode.running if r.device_len + 1 < r.max_device_len]
        retracted = scheduler.num_retractions
        step = plan(drafter)
        steps.append((step.batch if step else None, due, scheduler.num_retractions > retracted))
        return step

    scheduler.planner.plan = spy
    return steps


def run_burst(llm: LLM, streams: list[list[int]], burst: list[list[int]], burst_at: int = 5):
    """Start ``streams``, let them decode ``burst_at`` steps, add ``burst``; step until all finish.
    Returns the tokens per request and, per step, the uids that got a token."""
    sched = llm.scheduler
    for uid, prompt in enumerate(streams):
        sched.add_request(uid, prompt, STREAM)
    tokens: dict[int, list[int]] = {}
    per_step: list[set[int]] = []
    step = 0
    while sched.has_work:
        if step == burst_at:
            for i, prompt in enumerate(burst):
                sched.add_request(100 + i, prompt, SHORT)
        outs = sched.step() if sched.reqs else sched.drain()
        per_step.append({o.uid for o in outs})
        for o in outs:
            tokens.setdefault(o.uid, []).append(o.token)
        step += 1
    return tokens, per_step


def longest_pause(per_step: list[set[int]], uid: int) -> int:
    """Steps between two consecutive tokens of ``uid`` (1: a token every step).

    NOTE: a stream's first and second tokens are two steps apart under overlap (its prefill is read
    back before it joins decode), so callers pass the steps from the burst on, when it decodes."""
    got = [i for i, uids in enumerate(per_step) if uid in uids]
    return max(b - a for a, b in zip(got, got[1:]))


@pytest.fixture(scope="module")
def llama(tiny_checkpoints):
    return tiny_checkpoints["llama"]


@pytest.fixture(scope="module")
def workload():
    streams = random_prompts(3, [6, 9, 12], VOCAB, seed=1)
    burst = random_prompts(5, [70, 90, 60, 80, 75], VOCAB, seed=2)
    return streams, burst


def test_padding_tokens_are_the_dummy_requests():
    """A mixed batch padded to a multiple of 8: the real tokens are laid out as without padding; the
    padding is token 0 at position 0 of the dummy row (the page table's last), writing to slot 0."""
    import torch

    from minisgl.core import Feed, Req
    from minisgl.engine.batch import prepare_batch

    table = torch.arange(5 * 32, dtype=torch.int32).view(5, 32) + 1  # the dummy row's slot 0: below
    table[4, 0] = 0
    pool = torch.zeros(5, 32, dtype=torch.int32)
    pool[0, 7] = 42  # the decode row's last sampled token

    def reqs():
        dec = Req(uid=0, input_ids=list(range(7)), prompt_len=3, sampling_params=SHORT,
                  max_device_len=30, table_idx=0, cached_len=7, device_len=8)
        pre = Req(uid=1, input_ids=list(range(100, 111)), prompt_len=11, sampling_params=SHORT,
                  max_device_len=30, table_idx=2, cached_len=4, device_len=9)
        return Batch([Feed(dec, 7, 8), Feed.of(pre)], "mixed", num_decode=1)

    plain, padded = reqs(), reqs()
    prepare_batch(plain, table, pool)
    prepare_batch(padded, table, pool, pad_multiple=8)
    assert len(plain.input_ids) == 6 and len(padded.input_ids) == 8
    assert (padded.input_ids[:6].tolist() == plain.input_ids.tolist()
            == [42, 104, 105, 106, 107, 108])
    assert padded.positions.tolist() == [7, 4, 5, 6, 7, 8, 0, 0]
    assert padded.out_loc.tolist() == plain.out_loc.tolist() + [0, 0]
    assert padded.logits_idx.tolist() == plain.logits_idx.tolist() == [0]  # the chunk: no sample


@pytest.mark.parametrize("overlap", [True, False])
def test_every_step_carries_the_running_decode_tokens(llama, workload, overlap):
    llm = make_llm(llama, page_size=4, max_prefill_tokens=64, max_num_batched_tokens=32,
                   disable_overlap=not overlap)
    steps = record_steps(llm.scheduler)
    run_burst(llm, *workload)
    mixed = [b for b, _, _ in steps if b is not None and b.is_mixed]
    assert len(mixed) >= 10  # 375 burst tokens in chunks of at most 29 next to 3 streams
    for batch, due, retracted in steps:
        if due and not retracted:
            assert batch is not None
            assert [f.req for f in batch.feeds[: batch.num_decode_rows]] == due
            assert batch.num_tokens <= 32 or batch.is_decode
    llm.scheduler.check_integrity()


@pytest.mark.parametrize("mode", ["mixed", "prefill-first"])
def test_no_stream_waits_more_than_one_step(llama, workload, mode):
    """Step counter: with mixed steps each stream gets a token every step while the burst (longer
    than one step's budget) is prefilled; prefill-first pauses the streams for the whole burst."""
    llm = make_llm(llama, max_prefill_tokens=32, max_num_batched_tokens=32, schedule_mode=mode)
    _, per_step = run_burst(llm, *workload, burst_at=5)
    pauses = [longest_pause(per_step[5:], uid) for uid in range(3)]
    if mode == "mixed":
        assert pauses == [1, 1, 1]
    else:
        assert min(pauses) >= 375 // 32
    llm.scheduler.check_integrity()


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_greedy_equals_prefill_first(arch, tiny_checkpoints, workload):
    results = {}
    for mode in ("mixed", "prefill-first"):
        llm = make_llm(tiny_checkpoints[arch], page_size=4, max_prefill_tokens=24,
                       max_num_batched_tokens=24, schedule_mode=mode)
        results[mode] = run_burst(llm, *workload)[0]
        llm.scheduler.check_integrity()
    assert results["mixed"] == results["prefill-first"]
    assert sorted(results["mixed"]) == [0, 1, 2, 100, 101, 102, 103, 104]


@pytest.mark.parametrize("page_size", [1, 4])
def test_mixed_steps_under_memory_pressure_retract_and_keep_outputs(llama, workload, page_size):
    """A pool too small for everything: decode retracts, the retracted requests are re-fed in
    later mixed steps, and greedy tokens are those of a roomy pool."""
    roomy = run_burst(make_llm(llama, page_size=page_size, max_num_batched_tokens=32), *workload)[0]
    llm = make_llm(llama, page_size=page_size, num_pages=200 // page_size,
                   max_num_batched_tokens=32)
    steps = record_steps(llm.scheduler)
    assert run_burst(llm, *workload)[0] == roomy
    assert llm.scheduler.num_retractions > 0
    assert any(r for *_, r in steps)
    llm.scheduler.check_integrity()


def test_twins_wait_for_the_prefix_in_mixed_steps(llama):
    """Twins arriving while a stream decodes: the shared prefix is computed once."""
    shared = random_prompts(1, [80], VOCAB, seed=13)[0]
    twins = [shared + [5 + i] for i in range(4)]
    streams = random_prompts(2, [6, 9], VOCAB, seed=3)
    naive = make_llm(llama, cache="naive", max_num_batched_tokens=48)
    reference = run_burst(naive, streams, twins)[0]
    llm = make_llm(llama, max_num_batched_tokens=48)
    steps = record_steps(llm.scheduler)
    assert run_burst(llm, streams, twins)[0] == reference
    prefill = sum(r.extend_len for b, _, _ in steps if b is not None
                  for r in b.feeds[b.num_decode_rows :])
    assert prefill < 6 + 9 + 80 + 4 * 10
    llm.scheduler.check_integrity()


def test_prompt_logprobs_of_chunks_in_mixed_steps(llama):
    """Prompts chunked into mixed steps (a stream decodes meanwhile) get the same prompt log-probs
    as with prefill-first."""
    prompts = random_prompts(3, [5, 40, 33], VOCAB, seed=9)
    params = [STREAM] + [SamplingParams(max_tokens=2, prompt_logprobs=True, top_logprobs=2,
                                        temperature=0)] * 2
    outs = {}
    for mode in ("mixed", "prefill-first"):
        llm = make_llm(llama, max_prefill_tokens=12, max_num_batched_tokens=12, schedule_mode=mode)
        steps = record_steps(llm.scheduler)
        outs[mode] = llm.generate(prompts, params)
        mixed = sum(1 for b, _, _ in steps if b is not None and b.is_mixed)
        assert (mixed >= 5) == (mode == "mixed")
    for a, b in zip(outs["mixed"][1:], outs["prefill-first"][1:]):
        assert [e.token_id for e in a.prompt_logprobs] == [e.token_id for e in b.prompt_logprobs]
        for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [t for t, _ in x.top_logprobs] == [t for t, _ in y.top_logprobs]
    assert [o.token_ids for o in outs["mixed"]] == [o.token_ids for o in outs["prefill-first"]]


def test_lpm_admits_the_longest_cached_prefix_first(llama):
    """With one prefill slot per step, lpm picks the request whose prompt is cached; fcfs the first
    to arrive. Outputs are the same either way."""
    system = random_prompts(1, [48], VOCAB, seed=21)[0]
    cold, warm = random_prompts(1, [40], VOCAB, seed=22)[0], system + [7, 8, 9]
    order = {}
    for policy in ("lpm", "fcfs"):
        llm = make_llm(llama, schedule_policy=policy, max_prefill_tokens=16,
                       max_num_batched_tokens=16)
        llm.generate([system + [1, 2]], SHORT)  # caches the system prompt
        sched = llm.scheduler
        steps = record_steps(sched)
        sched.add_request(10, cold, SHORT)
        sched.add_request(11, warm, SHORT)
        while sched.has_work:
            sched.step() if sched.reqs else sched.drain()
        first = next(b for b, _, _ in steps if b is not None)
        order[policy] = [r.uid for r in first.feeds]
    assert order["lpm"][0] == 11 and order["fcfs"][0] == 10


def test_lpm_waiting_is_bounded(llama):
    """A request with nothing cached, behind a steady stream of cache hits and room for one
    admission per step, is admitted within ``max_wait_steps`` steps of its arrival."""
    system = random_prompts(1, [40], VOCAB, seed=31)[0]
    max_wait = 4
    llm = make_llm(llama, schedule_policy="lpm", max_wait_steps=max_wait, max_prefill_tokens=8,
                   max_num_batched_tokens=64, max_running_requests=64)
    llm.generate([system + [1]], SHORT)
    sched = llm.scheduler
    steps = record_steps(sched)
    # longer than a hit's uncached tail: a shorter one would share the hits' chunked steps at once
    # (prefill.py), which is not what this test is about
    cold = random_prompts(1, [12], VOCAB, seed=32)[0]
    sched.add_request(1000, cold, SHORT)
    arrived = len(steps)
    for i in range(12):  # a new cache hit every step, each needing a step of its own
        tail = random_prompts(1, [9], VOCAB, seed=100 + i)[0]  # 9 uncached tokens
        sched.add_request(i, system + tail, SHORT)
        sched.step()
    admitted = next(i for i, (b, _, _) in enumerate(steps)
                    if b is not None and any(r.uid == 1000 for r in b.feeds))
    assert 1 <= admitted - arrived <= max_wait + 1
    while sched.has_work:
        sched.step() if sched.reqs else sched.drain()
    sched.check_integrity()


def test_options_are_validated_and_resolved():
    with pytest.raises(ValueError, match="schedule_mode"):
        EngineOptions(schedule_mode="decode-first")
    with pytest.raises(ValueError, match="schedule_policy"):
        EngineOptions(schedule_policy="lifo")
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineOptions(max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="max_wait_steps"):
        EngineOptions(max_wait_steps=-1)
    import torch

    opts = EngineOptions(max_prefill_tokens=4096)
    assert opts.default_batched_tokens(torch.device("cpu"), online=False) == 4096
    assert opts.default_batched_tokens(torch.device("cpu"), online=True) == 256
    assert opts.default_batched_tokens(torch.device("cuda"), online=True) == 2048  # no config


@pytest.mark.parametrize("config, budget, eager", [
    ("qwen3-8b", 640, 1024), ("llama-3.1-8b-instruct", 640, 1024), ("qwen3-30b-a3b", 1664, 2048),
    ("qwen3-0.6b", 4096, 8192), ("qwen3-14b", 384, 1024), ("qwen3-32b", 128, 1024)])
def test_gpu_step_budget_follows_the_model_compute(config, budget, eager, tmp_path):
    """The server's default budget on CUDA: tokens costing about what 640 tokens of an 8B model
    cost (a multiple of 128), within the piecewise CUDA graphs (4096 tokens) and max_prefill_tokens;
    without the graphs, 1024 tokens of an 8B model, a power of two, at least 1024."""
    import shutil

    import torch

    from minisgl.llm.step_budget import matmul_weights_per_token

    src = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "configs",
                       f"{config}.json")
    shutil.copy(src, tmp_path / "config.json")
    opts = EngineOptions()
    assert opts.default_batched_tokens(torch.device("cuda"), True, str(tmp_path)) == budget
    assert opts.default_batched_tokens(torch.device("cpu"), True, str(tmp_path)) == 256
    no_graphs = EngineOptions(piecewise_cuda_graph_max_tokens=0)
    assert no_graphs.default_batched_tokens(torch.device("cuda"), True, str(tmp_path)) == eager
    few_graphs = EngineOptions(piecewise_cuda_graph_max_tokens=1024)
    assert few_graphs.default_batched_tokens(torch.device("cuda"), True,
                                             str(tmp_path)) == min(budget, 1024)
    small = EngineOptions(max_prefill_tokens=512)
    assert (small.default_batched_tokens(torch.device("cuda"), True, str(tmp_path))
            == min(budget, 512))
    with open(src) as f:
        weights = matmul_weights_per_token(json.load(f))
    if config == "qwen3-8b":  # 36 layers x (attention 4096 x 128 x 80 + MLP 3 x 4096 x 12288)
        assert weights == 36 * (4096 * 128 * 80 + 3 * 4096 * 12288)


@pytest.mark.gpu
def test_gpu_mixed_steps_keep_graphs_for_pure_decode(llama, workload):
    """On CUDA (fp32, Triton attention): pure decode steps still replay the decode CUDA graphs
    (mixed steps replay piecewise ones: test_piecewise.py), and greedy tokens equal
    prefill-first's."""
    results, replays = {}, {}
    for mode in ("mixed", "prefill-first"):
        llm = LLM(str(llama), device="cuda", dtype="float32", attn="triton", num_pages=1024,
                  page_size=4, max_prefill_tokens=32, max_num_batched_tokens=32,
                  cuda_graph_max_bs=8, schedule_mode=mode)
        runner = llm.scheduler.engine.graph_runner
        replay, count = runner.replay, [0]

        def counted(batch, greedy, replay=replay, count=count):
            assert batch.is_decode
            count[0] += 1
            return replay(batch, greedy)

        runner.replay = counted
        steps = record_steps(llm.scheduler)
        results[mode] = run_burst(llm, *workload)[0]
        replays[mode] = count[0]
        if mode == "mixed":
            assert sum(1 for b, _, _ in steps if b is not None and b.is_mixed) >= 10
        llm.close()
    assert results["mixed"] == results["prefill-first"]
    assert replays["mixed"] > 0 and replays["prefill-first"] > 0
