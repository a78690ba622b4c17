"""Gemma 3 and Gemma 4 against transformers, float32 on CPU: identical greedy tokens over 64 steps
and close logits, with prompts longer than the sliding window (8 tokens), chunked prefill whose
chunks cross the window's edge, mixed steps, radix hits, retraction, page sizes 1 and 16, and
TP=2; the Gemma 3 multimodal checkpoint layout served as text; the sliding layers' own pool with
its pages freed past the window."""

from __future__ import annotations

import logging

import pytest
import torch

from helpers.device import GPU_TEST_OPTIONS, TEST_DEVICE
from helpers.engine_utils import (
    conversation_with_radix_hits,
    prefill_logits,
    record_sampled_logits,
)
from helpers.gemma_models import WINDOW, make_gemma_checkpoint
from helpers.hf_models import hf_greedy, hf_model, hf_prefill_logits, random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device
ARCHS = ("gemma3", "gemma3_mm", "gemma4")
TEXT_ARCHS = ("gemma3", "gemma4")
NEW_TOKENS = 64
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
LENGTHS = [5, 23, 41]  # shorter than, about three times and five times the window

SETTINGS = {
    "page1": dict(page_size=1),
    "page16": dict(page_size=16),
    # chunks of 7 and 13 tokens: a chunk's queries see keys of the chunks before, across the
    # window's edge
    "chunked": dict(page_size=1, max_prefill_tokens=7),
    "chunked_page16": dict(page_size=16, max_prefill_tokens=13, disable_overlap=True),
    "mixed": dict(page_size=1, max_prefill_tokens=16, max_num_batched_tokens=12),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma")
    return {arch: str(make_gemma_checkpoint(arch, root / arch)) for arch in ARCHS}


@pytest.fixture(scope="module")
def prompts():
    assert max(LENGTHS) > 4 * WINDOW
    return random_prompts(len(LENGTHS), LENGTHS, 256, seed=0)


@pytest.fixture(scope="module")
def reference(checkpoints, prompts):
    return {arch: hf_greedy(checkpoints[arch], prompts, NEW_TOKENS) for arch in ARCHS}


def make_llm(path: str, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(path, device=TEST_DEVICE, dtype="float32", **{**GPU_TEST_OPTIONS, **options})


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_greedy_matches_transformers(arch, setting, checkpoints, prompts, reference):
    llm = make_llm(checkpoints[arch], **SETTINGS[setting])
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == reference[arch]
    llm.scheduler.check_integrity()


def test_multimodal_checkpoint_served_as_text(checkpoints, prompts, reference):
    llm = make_llm(checkpoints["gemma3_mm"], page_size=4)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == reference["gemma3_mm"]


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_and_decode_logits_match_transformers(arch, checkpoints, prompts):
    path = checkpoints[arch]
    llm = make_llm(path, page_size=16)
    logits = prefill_logits(llm.scheduler, prompts)
    expected = torch.cat(hf_prefill_logits(path, prompts))
    torch.testing.assert_close(logits.cpu(), expected, atol=1e-3, rtol=0)
    recorded = record_sampled_logits(llm.scheduler.engine)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    model = hf_model(path)
    for uid, (out, prompt) in enumerate(zip(outputs, prompts)):
        with torch.no_grad():
            ref = model(torch.tensor([prompt + out.token_ids[:-1]])).logits[0, len(prompt) - 1:]
        torch.testing.assert_close(torch.stack(recorded[uid]).cpu(), ref, atol=1e-3, rtol=0)


@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_hits_past_the_window(checkpoints, page_size):
    """Requests that share a 32-token prefix (four windows) resume from the cached KV of every
    layer, sliding and global, and give transformers' tokens."""
    path = checkpoints["gemma3"]
    shared = random_prompts(1, [32], 256, seed=1)[0]
    tails = random_prompts(2, [9, 14], 256, seed=2)
    prompts = [shared, shared + tails[0], shared[:20] + tails[1]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = hf_greedy(path, prompts, 16)
    llm = make_llm(path, page_size=page_size, cache="radix")
    cache, outputs, hits = llm.scheduler.cache, [], []
    for prompt in prompts:
        before = cache.num_hit_tokens
        outputs += llm.generate([prompt], params)
        hits.append(cache.num_hit_tokens - before)
    assert hits[1] == 32 and hits[2] == 20 // page_size * page_size
    assert [o.token_ids for o in outputs] == expected
    llm.scheduler.check_integrity()


def test_retraction_gives_the_same_tokens(checkpoints):
    path = checkpoints["gemma3"]
    prompts = random_prompts(5, [20, 25, 30, 18, 22], 256, seed=5)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = hf_greedy(path, prompts, 24)
    tight = make_llm(path, num_pages=110)
    outputs = tight.generate(prompts, params)
    assert tight.scheduler.num_retractions > 0
    assert [o.token_ids for o in outputs] == expected
    tight.scheduler.check_integrity()


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_tp2_matches_tp1(arch, checkpoints):
    """Two gloo ranks: two query heads and one KV head of each layer per rank (Gemma 4's global
    layers: their one KV head on both ranks), half of each expert's intermediate size."""
    from test_tp import run_rank, run_tp

    prompts = random_prompts(3, [6, 19, 40], 256, seed=11)
    logits1, tokens1 = run_rank(checkpoints[arch], prompts, 0, 1, "")
    logits2, tokens2 = run_tp(checkpoints[arch], prompts, 2)
    torch.testing.assert_close(logits2, logits1.cpu(), atol=1e-3, rtol=0)
    assert tokens2 == tokens1
    assert tokens1 == hf_greedy(checkpoints[arch], prompts, len(tokens1[0]))


# -- the sliding layers' own pool, pages freed past the window ----------------------------------


@pytest.mark.parametrize("setting", ["page1", "page16", "chunked", "mixed"])
@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_sliding_pool_gives_the_same_tokens(arch, setting, checkpoints, prompts, reference):
    llm = make_llm(checkpoints[arch], sliding_pool_ratio=0.1, cache="naive",
                   **SETTINGS[setting])
    assert llm.scheduler.cache.window is not None
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == reference[arch]
    llm.scheduler.check_integrity()


@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_the_default_gives_the_sliding_layers_their_pool(arch, checkpoints, prompts, reference,
                                                         caplog):
    """``sliding_pool_ratio="auto"`` (the default): four running requests' windows of 8 tokens
    and a forward of 16 take 57 pages, a small share of the 4096 a pool of every layer would
    have, so the sliding layers get their own of that size, the start-up log says so, and every
    token is transformers'. With 256 running requests' windows and forwards of 8192 tokens
    the sliding pool would be larger than one pool: one pool stays."""
    with caplog.at_level(logging.INFO, logger="minisgl.engine.engine"):
        llm = make_llm(checkpoints[arch], max_running_requests=4, max_prefill_tokens=16)
    engine = llm.scheduler.engine
    assert engine.num_pages == 4096 and engine.window_pages == 4 * (WINDOW + 2) + 16 + 1
    assert "4096 full-attention pages and 57 sliding-window pages" in caplog.text
    assert llm.scheduler.cache.window is not None
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == reference[arch]
    llm.scheduler.check_integrity()
    llm.close()
    assert make_llm(checkpoints[arch]).scheduler.engine.window_pages is None


@pytest.mark.parametrize("page_size", [1, 4])
def test_sliding_pool_smaller_than_the_requests(checkpoints, page_size):
    """Eight requests of 80-odd tokens each through a sliding pool of about 30 tokens: it holds
    each running request's window only, its pages go round many times, admission waits for them
    (the radix cache dropping the sliding pages it keeps), and every token is transformers'."""
    path = checkpoints["gemma3"]
    prompts = random_prompts(8, [20, 33, 41, 12, 27, 38, 15, 30], 256, seed=7)
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    llm = make_llm(path, page_size=page_size, sliding_pool_ratio=0.001, max_prefill_tokens=16,
                   max_running_requests=8)
    cache = llm.scheduler.cache
    window = cache.window
    pool_tokens = window.num_tokens
    assert pool_tokens <= 40 and cache.window.tree is not None
    taken, seen = [0], set()
    allocate = window.allocate

    def counting(rows, starts, counts):
        taken[0] += sum(counts)
        allocate(rows, starts, counts)
        seen.add(pool_tokens - window.free_tokens)

    window.allocate = counting
    outputs = llm.generate(prompts, params)
    assert taken[0] >= 3 * pool_tokens  # the pool was reused
    assert max(seen) <= pool_tokens
    assert [o.token_ids for o in outputs] == hf_greedy(path, prompts, 48)
    llm.scheduler.check_integrity()
    cache.flush_prefix_cache()
    assert window.free_tokens == pool_tokens  # all back at the end


def test_sliding_pool_with_retraction(checkpoints):
    path = checkpoints["gemma3"]
    prompts = random_prompts(5, [20, 25, 30, 18, 22], 256, seed=5)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    tight = make_llm(path, num_pages=110, sliding_pool_ratio=0.5, cache="naive")
    outputs = tight.generate(prompts, params)
    assert tight.scheduler.num_retractions > 0
    assert [o.token_ids for o in outputs] == hf_greedy(path, prompts, 24)
    tight.scheduler.check_integrity()


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_sliding_pool_with_radix_hits(arch, page_size, checkpoints):
    """A conversation of three turns, each prompt the last one with its answer and a new message:
    every turn resumes where the previous one's cached KV ends (the tree kept that turn's last
    window of sliding pages), and every token is transformers'."""
    conversation_with_radix_hits(checkpoints[arch], make_llm, page_size)


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
def test_sliding_pool_with_radix_hits_tp2(checkpoints):
    """The same conversation on two ranks (gloo on CPU): every rank frees, caches and resumes
    alike."""
    conversation_with_radix_hits(
        checkpoints["gemma3"], lambda path, **o: LLM(path, tp=2, device=TEST_DEVICE,
                                                     dtype="float32", num_pages=256, **o), 16)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", TEXT_ARCHS)
def test_sliding_pool_under_cuda_graphs(arch, checkpoints, prompts, reference):
    """Decode steps replay CUDA graphs that read the sliding layers' own page table (a static
    buffer; the pages freed past the window are stale entries the window masks) and gather the
    new tokens' sliding slots from it; with radix hits (conversation turns) too."""
    llm = LLM(checkpoints[arch], device="cuda", dtype="float32", num_pages=4096,
              sliding_pool_ratio=0.1, cache="radix")
    runner = llm.scheduler.engine.graph_runner
    assert runner is not None and llm.scheduler.cache.window.tree is not None
    replays, replay = [0], runner.replay

    def counting(batch, *args):
        replays[0] += 1
        return replay(batch, *args)

    runner.replay = counting
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == reference[arch]
    assert replays[0] >= NEW_TOKENS - 1
    llm.scheduler.check_integrity()
    conversation_with_radix_hits(
        checkpoints[arch], lambda path, **o: LLM(path, device="cuda", dtype="float32",
                                                 num_pages=4096 // o["page_size"], **o), 16)
