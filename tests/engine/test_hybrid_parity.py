"""Hybrid Gated DeltaNet models (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) against transformers, float32
on CPU: identical greedy tokens over 64 steps and close logits, with the recurrent state carried
through chunked prefill (chunks that split a run of linear layers' input mid-prompt), mixed
steps, retraction, both page sizes and TP=2."""

from __future__ import annotations

import inspect

import pytest
import torch

from helpers.device import GPU_TEST_OPTIONS, TEST_DEVICE
from helpers.engine_utils import prefill_logits, record_sampled_logits
from helpers.hf_models import hf_greedy, hf_model, hf_prefill_logits, random_prompts
from helpers.hybrid_models import HYBRID_ARCHS, make_hybrid_checkpoint
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device  # MINISGL_TEST_DEVICE=cuda: fla's kernels, float32

NEW_TOKENS = 64
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
LENGTHS = [5, 23, 41]

SETTINGS = {
    "page1": dict(page_size=1),
    "page16": dict(page_size=16),
    # chunks of 7 and 13 tokens: every prompt but the shortest is split mid-prompt
    "chunked": dict(page_size=1, max_prefill_tokens=7),
    "chunked_page16": dict(page_size=16, max_prefill_tokens=13, disable_overlap=True),
    # decode rows next to prefill chunks in one forward
    "mixed": dict(page_size=1, max_prefill_tokens=16, max_num_batched_tokens=12),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    return {arch: str(make_hybrid_checkpoint(arch, root / arch)) for arch in HYBRID_ARCHS}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(len(LENGTHS), LENGTHS, 256, seed=0)


@pytest.fixture(scope="module")
def reference(checkpoints, prompts):
    return {arch: hf_greedy(checkpoints[arch], prompts, NEW_TOKENS) for arch in HYBRID_ARCHS}


def make_llm(path: str, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(path, device=TEST_DEVICE, dtype="float32", **{**GPU_TEST_OPTIONS, **options})


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_greedy_matches_transformers(arch, setting, checkpoints, prompts, reference):
    llm = make_llm(checkpoints[arch], **SETTINGS[setting])
    outputs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outputs] == reference[arch]
    llm.scheduler.check_integrity()


@pytest.mark.slow
@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_prefill_and_decode_logits_match_transformers(arch, checkpoints, prompts):
    path = checkpoints[arch]
    llm = make_llm(path, page_size=16)
    logits = prefill_logits(llm.scheduler, prompts)
    expected = torch.cat(hf_prefill_logits(path, prompts))
    # float32 rounding, amplified by these small random models (a few 1e-3 on logits of std ~10
    # where the chunked and the token-by-token delta rule meet): 1e-3 of the logits' spread. On
    # CUDA fla's chunked prefill solves its triangular system in TF32 whatever TRITON_F32_DEFAULT
    # says (``SOLVE_TRIL_DOT_PRECISION`` in fla/ops/gated_delta_rule/chunk_fwd.py): a unit
    # roundoff of 2**-11, summed over a 64-token chunk (~8x), carried linearly to the logits
    atol = (1e-2 if TEST_DEVICE == "cuda" else 1e-3) * float(expected.std())
    torch.testing.assert_close(logits.cpu(), expected, atol=atol, rtol=0)
    recorded = record_sampled_logits(llm.scheduler.engine)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    model = hf_model(path)
    # the cache is ``cache`` from transformers 5.25 on, ``past_key_values`` before
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"
    for uid, (out, prompt) in enumerate(zip(outputs, prompts)):
        # transformers' own decode (its cache, the token-by-token rule), as the engine decodes:
        # re-reading the answer as one prefill would compare the chunked rule with the
        # recurrent one, whose float32 rounding the MoE family's near-tied routes amplify
        with torch.no_grad():
            step = model(torch.tensor([prompt]), use_cache=True)
            ref = [step.logits[0, -1]]
            for token in out.token_ids[:-1]:
                step = model(torch.tensor([[token]]), use_cache=True, **{name: step[name]})
                ref.append(step.logits[0, -1])
        torch.testing.assert_close(torch.stack(recorded[uid]).cpu(), torch.stack(ref),
                                   atol=atol, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [True, False])
def test_retraction_restarts_the_state(checkpoints, overlap):
    """A retracted request is re-fed from its tokens into a fresh state: the same tokens."""
    path = checkpoints["qwen3_5"]
    prompts = random_prompts(5, [20, 25, 30, 18, 22], 256, seed=5)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = [o.token_ids for o in make_llm(path).generate(prompts, params)]
    tight = make_llm(path, num_pages=110, disable_overlap=not overlap)
    outputs = tight.generate(prompts, params)
    assert tight.scheduler.num_retractions > 0
    assert [o.token_ids for o in outputs] == expected
    tight.scheduler.check_integrity()


@pytest.mark.slow
@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_hit_resumes_from_a_snapshot(checkpoints, page_size):
    """Requests sharing prefixes resume from the snapshots earlier ones left: at a whole earlier
    prompt (a snapshot at its end), and at a branch point inside the tree (20 shared tokens: the
    first request to diverge there stops a chunk at the branch and is snapshotted, so the next
    one hits it). Tokens are transformers', the cache's integrity holds."""
    path = checkpoints["qwen3_next"]
    shared = random_prompts(1, [32], 256, seed=1)[0]
    tails = random_prompts(3, [9, 14, 11], 256, seed=2)
    prompts = [shared, shared + tails[0], shared[:20] + tails[1], shared[:20] + tails[2]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = hf_greedy(path, prompts, 16)
    llm = make_llm(path, page_size=page_size, cache="radix")
    cache, outputs, hits = llm.scheduler.cache, [], []
    for prompt in prompts:
        before = cache.num_hit_tokens
        outputs += llm.generate([prompt], params)
        hits.append(cache.num_hit_tokens - before)
    branch = 20 // page_size * page_size
    assert hits == [0, 32, 0, branch]
    assert [o.token_ids for o in outputs] == expected
    llm.scheduler.check_integrity()


@pytest.mark.slow
@pytest.mark.skipif(TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_tp2_matches_tp1(arch, checkpoints):
    """Two gloo ranks: half the linear heads, conv channels and state of each layer per rank.

    The tolerance is rounding's, the one the comparison with transformers uses (1e-3 of the
    logits' spread): these six-layer random models amplify the all-reduce's different summation
    order to a few 1e-3 on logits of std ~20 (TP=1 against transformers differs as much on the
    same rows)."""
    from test_tp import run_rank, run_tp

    prompts = random_prompts(3, [6, 19, 40], 256, seed=11)
    logits1, tokens1 = run_rank(checkpoints[arch], prompts, 0, 1, "")
    logits2, tokens2 = run_tp(checkpoints[arch], prompts, 2)
    torch.testing.assert_close(logits2, logits1.cpu(), atol=1e-3 * float(logits1.std()), rtol=0)
    assert tokens2 == tokens1
