"""Speculative decoding on the real scheduler and engine (tiny models, CPU): greedy and seeded
outputs are the outputs without speculation, for every proposer, dense and MoE, page sizes 1 and
16, with radix hits, chunked prefill, retraction and TP=2; stops inside an accepted run stop
exactly there; only accepted tokens reach the prefix cache. Hybrid models: ``test_spec_hybrid.py``.
"""

from __future__ import annotations

import pytest
import torch

from helpers.device import TEST_DEVICE
from helpers.hf_models import random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device
VOCAB = 256
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
METHODS = ("ngram", "suffix")


def spec(method: str, **extra) -> dict:
    """A speculative config; the adaptive draft length is off (it follows measured step times,
    which would make how much is drafted vary from run to run; ``test_proposers.py`` tests it)."""
    return {"method": method, "num_speculative_tokens": 4, "adaptive": False, **extra}


def make_llm(model, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(str(model), device=TEST_DEVICE, dtype="float32", **options)


def repetitive_prompts(n: int = 4, seed: int = 3) -> list[list[int]]:
    """Random text with a repeated stretch, so that drafts are proposed and often accepted."""
    base = random_prompts(n, [20, 30, 25, 40, 18, 33][:n], VOCAB, seed=seed)
    return [p + p[:10] + p for p in base]


def generate(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    outs = [o.token_ids for o in llm.generate(prompts, params)]
    llm.scheduler.check_integrity()
    return outs


@pytest.fixture(scope="module")
def expected(tiny_checkpoints):
    """Outputs without speculation, per (arch, page size)."""
    cache = {}

    def get(arch: str, page_size: int, prompts, params=GREEDY):
        key = (arch, page_size, str(prompts), params)
        if key not in cache:
            llm = make_llm(tiny_checkpoints[arch], page_size=page_size)
            cache[key] = generate(llm, prompts, params)
            llm.close()
        return cache[key]

    return get


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_equals_no_speculation(tiny_checkpoints, expected, method, arch, page_size):
    prompts = repetitive_prompts()
    llm = make_llm(tiny_checkpoints[arch], page_size=page_size, speculative_config=spec(method))
    assert generate(llm, prompts) == expected(arch, page_size, prompts)
    stats = llm.scheduler.spec.stats
    assert stats.verify_steps > 0 and 0 < stats.accepted_tokens < stats.draft_tokens
    llm.close()


@pytest.mark.skipif(TEST_DEVICE != "cuda", reason="bf16 decode graphs: GPU only")
@pytest.mark.parametrize("method", METHODS)
def test_greedy_equals_no_speculation_in_bf16_with_one_graph_size(tiny_checkpoints, method):
    """In bf16 a one-row decode step (a GEMV) and a verify step's rows (a GEMM) round differently,
    so greedy tokens can part ways at a near tie. With only the 16-row graph captured
    (``--cuda-graph-bs 16``) every step of a request alone replays it: the same kernels for every
    row, and the same tokens."""
    model, opts = str(tiny_checkpoints["llama"]), dict(dtype="bfloat16", cuda_graph_bs=(16,))
    prompts = repetitive_prompts()
    base = LLM(model, device="cuda", **opts)
    want = [generate(base, [p])[0] for p in prompts]
    base.close()
    llm = LLM(model, device="cuda", speculative_config=spec(method), **opts)
    assert [generate(llm, [p])[0] for p in prompts] == want
    assert llm.scheduler.engine.graph_runner.sizes == [16]
    assert llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


@pytest.mark.parametrize("method", METHODS)
def test_radix_hits_and_chunked_prefill(tiny_checkpoints, expected, method):
    """Prompts sharing prefixes, run twice (the second time from the prefix cache), fed in
    chunks of 16 tokens."""
    prompts = repetitive_prompts()
    prompts = prompts + [prompts[0][:30] + prompts[1][:20]]
    llm = make_llm(tiny_checkpoints["llama"], page_size=4, max_prefill_tokens=16,
                   max_num_batched_tokens=24, speculative_config=spec(method))
    first = generate(llm, prompts)
    hits = llm.scheduler.cache.num_hit_tokens
    assert generate(llm, prompts) == first == expected("llama", 4, prompts)
    assert llm.scheduler.cache.num_hit_tokens > hits
    llm.close()


@pytest.mark.parametrize("page_size", [1, 16])
def test_retraction(tiny_checkpoints, expected, page_size):
    """A pool too small for every request at once: requests are retracted and re-fed."""
    prompts = repetitive_prompts(6, seed=5)
    llm = make_llm(tiny_checkpoints["llama"], page_size=page_size, num_pages=400 // page_size,
                   speculative_config=spec("ngram"))
    assert generate(llm, prompts) == expected("llama", page_size, prompts)
    assert llm.scheduler.num_retractions > 0
    assert llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


@pytest.mark.parametrize("method", METHODS)
def test_seeded_sampling_is_the_same_sequence(tiny_checkpoints, expected, method):
    """Each verified position draws with the request's seed at its output index, so a seeded
    request gives the very tokens it gives without speculation (logit_bias, top-p, log-probs
    included)."""
    prompts = repetitive_prompts()
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=11, max_tokens=30, ignore_eos=True,
                            logit_bias={5: 3.0}, logprobs=True, top_logprobs=2)
    llm = make_llm(tiny_checkpoints["llama"], speculative_config=spec(method))
    outs = llm.generate(prompts, params)
    base = make_llm(tiny_checkpoints["llama"]).generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in base]
    for o, b in zip(outs, base):
        assert [lp.token_id for lp in o.logprobs] == o.token_ids
        for x, y in zip(o.logprobs, b.logprobs):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [t for t, _ in x.top_logprobs] == [t for t, _ in y.top_logprobs]
    assert llm.scheduler.spec.stats.verify_steps > 0
    llm.close()


def test_penalties_do_not_speculate_and_are_counted(tiny_checkpoints):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True,
                            repetition_penalty=1.3)
    prompts = repetitive_prompts(2)
    llm = make_llm(tiny_checkpoints["llama"], speculative_config=spec("ngram"))
    outs = generate(llm, prompts, params)
    assert outs == generate(make_llm(tiny_checkpoints["llama"]), prompts, params)
    stats = llm.scheduler.spec.stats
    assert stats.verify_steps == 0 and stats.skipped == {"penalties": 2}
    llm.close()


def test_large_batches_do_not_speculate(tiny_checkpoints, expected):
    prompts = repetitive_prompts()
    llm = make_llm(tiny_checkpoints["llama"],
                   speculative_config=spec("ngram", disable_by_batch_size=2))
    assert generate(llm, prompts) == expected("llama", 1, prompts)
    stats = llm.scheduler.spec.stats
    llm.close()
    # four requests run together at first: nobody speculates until two have finished
    solo = make_llm(tiny_checkpoints["llama"], speculative_config=spec("ngram"))
    generate(solo, prompts)
    assert stats.verify_steps < solo.scheduler.spec.stats.verify_steps
    solo.close()


def _runs(llm: LLM, prompts, params) -> dict[int, list[list[int]]]:
    """Per request, the tokens of each step (a verify step can bring several)."""
    sched = llm.scheduler
    for uid, p in enumerate(prompts):
        sched.add_request(uid, p, params)
    runs: dict[int, list[list[int]]] = {}
    while sched.has_work:
        step: dict[int, list[int]] = {}
        for out in sched.step():
            step.setdefault(out.uid, []).append(out.token)
        for uid, tokens in step.items():
            runs.setdefault(uid, []).append(tokens)
    sched.check_integrity()
    return runs


def test_stops_inside_an_accepted_run_stop_there(tiny_checkpoints, expected):
    """max_tokens, a stop token id and EOS falling in the middle of a multi-token run end the
    request exactly where they end it without speculation."""
    path = tiny_checkpoints["llama"]
    prompts = repetitive_prompts()
    runs = _runs(make_llm(path, speculative_config=spec("ngram")), prompts, GREEDY)
    uid, at = next((uid, sum(map(len, rs[:i])) + 1) for uid, rs in runs.items()
                   for i, r in enumerate(rs) if len(r) >= 3)
    full = expected("llama", 1, prompts)[uid]
    assert [t for r in runs[uid] for t in r] == full
    prompt = [prompts[uid]]
    # max_tokens in the middle of the run
    params = SamplingParams(temperature=0, max_tokens=at + 1, ignore_eos=True)
    out = make_llm(path, speculative_config=spec("ngram")).generate(prompt, params)[0]
    assert out.token_ids == full[: at + 1] and out.finish_reason == "length"
    # a stop token, then EOS: a token inside a multi-token run (not its last); the request stops
    # at its first occurrence, inside a run too when it is new there (accepted drafts mostly copy
    # earlier output, so it often is not)
    starts = [sum(map(len, runs[uid][:i])) for i in range(len(runs[uid]))]
    inside = [s + j for s, r in zip(starts, runs[uid]) for j in range(len(r) - 1)]
    first = next((i for i in inside if full[i] not in full[:i]), None)
    if first is None:
        first = full.index(full[inside[0]])
    stop = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[full[first]])
    out = make_llm(path, speculative_config=spec("ngram")).generate(prompt, stop)[0]
    assert out.token_ids == full[: first + 1] and out.finish_reason == "stop"
    llm = make_llm(path, speculative_config=spec("ngram"))
    llm.scheduler.eos_token_ids = frozenset({full[first]})
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40))[0]
    assert out.token_ids == full[: first + 1] and out.finish_reason == "stop"
    llm.scheduler.check_integrity()


def test_suffix_learns_finished_answers_in_spare_time(tiny_checkpoints):
    """A finished answer joins suffix decoding's global trie a slice at a time: after each launch
    while other requests run, and while the scheduler is idle (``Scheduler.idle``; ``generate``
    does the rest before it returns)."""
    llm = make_llm(tiny_checkpoints["llama"], speculative_config=spec("suffix"))
    proposer = llm.scheduler.spec.proposer
    trie, slices = proposer.shared, []
    spare = proposer.spare
    proposer.spare = lambda budget: (slices.append((budget, len(trie.texts))), spare(budget))[1]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (5, 40)]
    answers = generate(llm, repetitive_prompts(2), params)
    assert list(trie.texts) == answers and not trie.jobs
    # the short answer was learned while the long one ran, 8 suffixes a step
    assert (8, 1) in slices and slices.index((8, 1)) < len(slices) - 1
    assert slices[-1][0] == 256  # the long one, after the last step
    llm.close()


def test_only_accepted_tokens_are_cached(tiny_checkpoints):
    """After the requests end, the prefix cache holds exactly what it holds without
    speculation: rejected drafts never enter it."""
    prompts = repetitive_prompts()
    sizes = []
    for config in (None, spec("ngram"), spec("suffix")):
        llm = make_llm(tiny_checkpoints["llama"], speculative_config=config,
                       disable_overlap=True)
        generate(llm, prompts)
        tree = llm.scheduler.cache.prefix_cache
        sizes.append((tree.evictable_size, tree.protected_size))
        llm.close()
    assert sizes[0] == sizes[1] == sizes[2]


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
def test_tp2(tiny_checkpoints, expected):
    prompts = repetitive_prompts()
    llm = make_llm(tiny_checkpoints["qwen3"], tp=2, num_pages=1024,
                   speculative_config=spec("suffix"))
    try:
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == \
            [o.token_ids for o in make_llm(tiny_checkpoints["qwen3"], num_pages=1024)
             .generate(prompts, GREEDY)]
    finally:
        llm.close()


def test_requests_that_run_into_the_context_limit(tiny_checkpoints):
    """Drafts never reach past the context: the last verified position stays inside the page
    table and the token pool."""
    prompts = repetitive_prompts(2)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True, clamp_max_tokens=True)
    outs = [generate(make_llm(tiny_checkpoints["llama"], max_seq_len=96, speculative_config=c),
                     prompts, params) for c in (None, spec("ngram"))]
    assert outs[0] == outs[1] and all(len(p) + len(o) == 96 for p, o in zip(prompts, outs[0]))


def test_the_warm_up_leaves_no_trace_in_the_statistics(tiny_checkpoints):
    """The warm-up's requests (penalties, grammars, random prompts) neither count in the
    acceptance statistics nor teach the suffix trees."""
    llm = make_llm(tiny_checkpoints["llama"], speculative_config=spec("suffix"), warmup="on")
    spec_decoder = llm.scheduler.spec
    assert spec_decoder.stats.verify_steps == 0 and spec_decoder.stats.skipped == {}
    assert not spec_decoder.accept_state and not spec_decoder.proposer.shared.texts
    prompts = repetitive_prompts(2)
    assert generate(llm, prompts) == generate(make_llm(tiny_checkpoints["llama"]), prompts)
    llm.close()


class _FixedCost:
    """A ``StepCost`` whose verify step costs ``ratio`` plain steps, whatever the clock says."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def add(self, verified: bool, seconds: float) -> None:
        pass

    def probe(self) -> bool:
        return False


@pytest.mark.parametrize("ratio", [1.0, 50.0])
def test_adaptive_length_follows_the_step_cost(tiny_checkpoints, expected, ratio):
    """With the adaptive length on, the engine's measured cost decides: at 1 plain step a verify
    step pays and requests speculate; at 50 no acceptance pays and no request verifies drafts
    (they draft in the shadow only). The output is the output without speculation either way."""
    prompts = repetitive_prompts()
    llm = make_llm(tiny_checkpoints["llama"], speculative_config=spec("ngram", adaptive=True))
    llm.scheduler.spec.cost = _FixedCost(ratio)
    assert generate(llm, prompts) == expected("llama", 1, prompts)
    stats = llm.scheduler.spec.stats
    if ratio == 1.0:
        assert stats.verify_steps > 0 and stats.accepted_tokens > 0
    else:
        assert stats.verify_steps == 0
    llm.close()


def test_requests_without_drafts_stop_asking_and_keep_overlap(tiny_checkpoints, expected):
    """A proposer with nothing to draft (chat, where nothing repeats): after ``MISSES`` steps in a
    row the request stops asking, so its steps keep overlap scheduling (each launched before the
    one before is read back) instead of reading every step back first in case it drafts; once the
    proposer has drafts again (here after 12 tokens), it speculates."""
    prompts = repetitive_prompts(1)
    llm = make_llm(tiny_checkpoints["llama"], speculative_config=spec("ngram", adaptive=True))
    decoder = llm.scheduler.spec
    decoder.cost = _FixedCost(1.0)  # the clock out of it
    propose = decoder.proposer.propose
    decoder.proposer.propose = lambda req, n: propose(req, n) if req.output_len >= 12 else []
    events = watch_launches(llm.scheduler)
    assert generate(llm, prompts) == expected("llama", 1, prompts)
    assert decoder.stats.verify_steps > 0
    early = events[: 2 * 12]  # about the first 12 tokens' launches and read-backs
    # about 12 forwards, the first few read back first (the prefill, MISSES steps that asked);
    # without the rule none overlaps
    assert overlapped(early) >= 7, early
    llm.close()


def watch_launches(sched) -> list[tuple[str, int]]:
    """The scheduler's forwards in order: ("launch", i) when the i-th is launched, ("read", i) when
    it is read back."""
    events: list[tuple[str, int]] = []
    index: dict[int, int] = {}
    kept: list = []
    forward, read_back = sched.engine.forward, sched._read_back

    def launched(*args):
        out = forward(*args)
        kept.append(out)  # alive, so that no later output takes its id
        index[id(out)] = len(index)
        events.append(("launch", index[id(out)]))
        return out

    def read(launched):
        events.append(("read", index[id(launched.out)]))
        return read_back(launched)

    sched.engine.forward, sched._read_back = launched, read
    return events


def overlapped(events: list[tuple[str, int]]) -> int:
    """How many forwards were read back after the next one was launched."""
    seen: set[int] = set()
    count = 0
    for what, i in events:
        if what == "launch":
            seen.add(i)
        elif what == "read" and i + 1 in seen:
            count += 1
    return count
