"""Scheduling under memory pressure, seeded sampling through the engine, and bad inputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.device import TEST_DEVICE
from helpers.hf_models import random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device
VOCAB = 256
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def make_llm(model, **options):
    return LLM(model, device=TEST_DEVICE, dtype="float32", **options)


@pytest.fixture(scope="module")
def llama(tiny_checkpoints):
    return str(tiny_checkpoints["llama"])


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("cache", ["radix", "naive"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_small_pool_retracts_and_matches_unconstrained(llama, page_size, cache, overlap):
    prompts = random_prompts(6, [20, 25, 30, 18, 22, 27], VOCAB, seed=5)
    roomy = make_llm(llama, num_pages=4096 // page_size, page_size=page_size, cache=cache)
    expected = [o.token_ids for o in roomy.generate(prompts, GREEDY)]
    # room for about three requests at full length: decode must retract some and re-run them later
    tight = make_llm(llama, num_pages=150 // page_size, page_size=page_size, cache=cache,
                     disable_overlap=not overlap)
    outputs = tight.generate(prompts, GREEDY)
    sched = tight.scheduler
    assert sched.num_retractions > 0
    assert [o.token_ids for o in outputs] == expected
    assert not sched.has_work
    sched.check_integrity()
    free = sched.cache.free_tokens
    assert free + sched.cache.prefix_cache.evictable_size == sched.cache.num_tokens
    assert sched.cache.prefix_cache.protected_size == 0


def test_abort_frees_everything(llama):
    llm = make_llm(llama, num_pages=512)
    sched = llm.scheduler
    for uid, prompt in enumerate(random_prompts(3, [10, 40, 70], VOCAB, seed=6)):
        sched.add_request(uid, prompt, GREEDY)
    sched.step()
    sched.step()
    for uid in range(3):
        assert sched.abort(uid)
    assert not sched.abort(0)
    assert not sched.has_work
    sched.check_integrity()
    assert sched.cache.prefix_cache.protected_size == 0


def test_stop_conditions(llama):
    llm = make_llm(llama, num_pages=512)
    prompt = random_prompts(1, [12], VOCAB, seed=7)[0]
    free_run = llm.generate([prompt], GREEDY)[0].token_ids
    stop_at = free_run[5]
    first = free_run.index(stop_at)
    params = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop_at])
    out = llm.generate([prompt], params)[0]
    assert out.finish_reason == "stop" and out.token_ids == free_run[: first + 1]
    short = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert short.finish_reason == "length" and short.token_ids == free_run[:3]
    # EOS (id 2 in the tiny checkpoints) stops unless ignore_eos
    eos_llm = make_llm(llama, num_pages=512)
    eos_llm.scheduler.eos_token_ids = frozenset({stop_at})
    out = eos_llm.generate([prompt], SamplingParams(temperature=0, max_tokens=24))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == stop_at
    out = eos_llm.generate([prompt], GREEDY)[0]
    assert out.token_ids == free_run


@pytest.mark.parametrize("overlap", [True, False])
def test_seeded_sampling_is_batch_independent(llama, overlap):
    llm = make_llm(llama, num_pages=1024, disable_overlap=not overlap)
    prompts = random_prompts(4, [8, 16, 24, 32], VOCAB, seed=8)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate([prompts[2]], params)[0].token_ids
    again = llm.generate([prompts[2]], params)[0].token_ids
    other = SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True)
    mixed = llm.generate(prompts, [other, other, params, other])[2].token_ids
    assert alone == again == mixed
    different = llm.generate([prompts[2]], SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16,
                                                          seed=99, ignore_eos=True))
    assert different[0].token_ids != alone


def test_top_k_one_equals_greedy(llama):
    llm = make_llm(llama, num_pages=1024)
    prompts = random_prompts(2, [9, 21], VOCAB, seed=9)
    greedy = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    topk1 = SamplingParams(temperature=1.5, top_k=1, max_tokens=24, ignore_eos=True)
    assert [o.token_ids for o in llm.generate(prompts, topk1)] == greedy


def test_logprobs_are_consistent(llama):
    llm = make_llm(llama, num_pages=1024)
    prompt = random_prompts(1, [15], VOCAB, seed=10)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, logprobs=True,
                                                top_logprobs=3))[0]
    assert len(out.logprobs) == 8
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok and lp.logprob <= 0
        ids = [i for i, _ in lp.top_logprobs]
        values = [v for _, v in lp.top_logprobs]
        assert ids[0] == tok and values == sorted(values, reverse=True) and len(ids) == 3
        assert lp.logprob == pytest.approx(values[0])
    plain = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8))[0]
    assert plain.logprobs is None


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("min_p", 2.0),
        ("max_tokens", -1),
        ("presence_penalty", 3.0),
        ("repetition_penalty", 0.0),
        ("top_logprobs", 50),
        ("seed", -1),
        ("temperature", float("nan")),
        ("max_tokens", "8"),
        ("stop", [""]),
    ],
)
def test_bad_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_bad_prompts_raise_clear_errors(llama):
    llm = make_llm(llama, num_pages=256, max_seq_len=128)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate([[5, VOCAB + 3]], GREEDY)
    with pytest.raises(ValueError, match="too long.*128"):
        llm.generate([list(range(3, 200))], GREEDY)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate([[5, 6], [7, 8]], [GREEDY])
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate(["text needs a tokenizer"], GREEDY)
    # the engine keeps serving after every error, with nothing leaked
    assert len(llm.generate([[5, 6, 7]], GREEDY)[0].token_ids) == 24
    llm.scheduler.check_integrity()


def test_max_tokens_beyond_the_context(llama):
    llm = make_llm(llama, num_pages=256, max_seq_len=128)
    prompt = list(range(3, 103))  # 100 tokens: 28 are left
    with pytest.raises(ValueError, match="maximum context length is 128 tokens.*requested 140 "
                                         r"tokens \(100 in the prompt, 40 in the completion\)"):
        llm.generate([prompt], dataclasses.replace(GREEDY, max_tokens=40, ignore_eos=True))
    clamped = dataclasses.replace(GREEDY, max_tokens=40, ignore_eos=True, clamp_max_tokens=True)
    out = llm.generate([prompt], clamped)[0]
    assert len(out.token_ids) == 28 and out.finish_reason == "length"
    llm.scheduler.check_integrity()


def test_bad_options_and_models(tmp_path, llama):
    with pytest.raises(TypeError, match="no_such_option"):
        make_llm(llama, no_such_option=1)
    with pytest.raises(ValueError, match="page_size"):
        make_llm(llama, page_size=0)
    with pytest.raises(ValueError, match="cache"):
        make_llm(llama, cache="lru")
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        make_llm(str(tmp_path / "does-not-exist"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"architectures": ["GPTNeoXForCausalLM"], "model_type": "x",'
                                     ' "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 8,'
                                     ' "num_hidden_layers": 1}')
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM.*LlamaForCausalLM"):
        make_llm(str(bad))


@pytest.mark.parametrize("overlap", [True, False])
def test_twins_share_a_prefix_computed_once(llama, overlap):
    """Requests with the same long prompt (n > 1, a shared system prompt) admitted together: one
    computes the prompt, the others reuse it from the radix cache, and outputs are unchanged."""
    shared = random_prompts(1, [80], VOCAB, seed=13)[0]
    prompts = [shared + [5 + i] for i in range(4)] + [shared] * 2
    reference = [o.token_ids for o in make_llm(llama, num_pages=4096, cache="naive")
                 .generate(prompts, GREEDY)]
    llm = make_llm(llama, num_pages=4096, disable_overlap=not overlap)
    computed = []
    forward = llm.scheduler.engine.forward

    def spy(batch, args):
        computed.append(sum(r.extend_len for r in batch.feeds[batch.num_decode_rows :]))
        return forward(batch, args)

    llm.scheduler.engine.forward = spy
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == reference
    # the 80 shared tokens once, then each request's uncached tail (a few tokens each)
    assert sum(computed) < 80 + 6 * 10, computed
    assert llm.scheduler.cache.num_hit_tokens >= 5 * 79
    llm.scheduler.check_integrity()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
def test_to_device_sends_aligned_segments(dtype):
    """One transfer, one tensor per list, each 16-byte aligned (Triton specialises on alignment)."""
    from minisgl.utils.transfer import to_device

    segments = [[1, 2, 3], [], [4], [5, 6, 7, 8, 9]]
    out = to_device(segments, dtype, torch.device(TEST_DEVICE))
    assert [t.tolist() for t in out] == [[float(v) if dtype.is_floating_point else v for v in s]
                                         for s in segments]
    assert all(t.dtype == dtype and t.data_ptr() % 16 == 0 for t in out)
    assert len({t.untyped_storage().data_ptr() for t in out}) == 1


def test_llm_close_and_context_manager(tiny_checkpoints):
    """``with LLM(...)`` closes on exit; close() is idempotent and generate() afterwards is an
    error."""
    prompts = random_prompts(2, [5, 9], VOCAB, seed=3)
    with make_llm(str(tiny_checkpoints["llama"]), num_pages=256) as llm:
        assert len(llm.generate(prompts, GREEDY)[0].token_ids) == 24
    llm.close()
    with pytest.raises(RuntimeError, match="after close"):
        llm.generate(prompts, GREEDY)
