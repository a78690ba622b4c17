"""Speculative decoding on hybrid (Gated DeltaNet) tiny models, CPU, torch backends: a verifying
request leaves the recurrent state after each fed token in draft slots and resumes from the
accepted one, so greedy outputs are the outputs without speculation (pages 1 and 16, radix hits,
chunked prefill, stops inside accepted runs), and the state snapshots the prefix cache keeps are
the ones it keeps without speculation.

The random models rarely repeat themselves, so n-gram drafts would seldom be proposed: most tests
draft with ``Oracle``, the baseline's own continuation with one token in three drafts corrupted
(long accepted runs and rejections at every draft position). The suffix proposer is exercised by
a second pass over the same prompts (its tree remembers the first pass's outputs)."""

from __future__ import annotations

import pytest
import torch

from helpers.device import TEST_DEVICE
from helpers.hf_models import random_prompts
from helpers.hybrid_models import make_hybrid_checkpoint
from minisgl import LLM, SamplingParams
from minisgl.scheduler.state_slots import RecurrentStateManager
from minisgl.speculative.proposer import Proposer

pytestmark = pytest.mark.any_device
VOCAB = 256
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


class Oracle(Proposer):
    """Drafts the known continuation of each prompt, every third draft with one wrong token
    (at a position that cycles): acceptance is high, and every prefix length gets rejected."""

    name = "oracle"

    def __init__(self, full: dict[tuple[int, ...], list[int]]) -> None:
        self.full, self.calls = full, 0

    def propose(self, req, max_len: int) -> list[int]:
        self.calls += 1
        seq = self.full[tuple(req.input_ids[: req.prompt_len])]
        draft = list(seq[len(req.input_ids) : len(req.input_ids) + max_len])
        if draft and self.calls % 3:
            j = self.calls % len(draft)
            draft[j] = (draft[j] + 1) % VOCAB
        return draft


@pytest.fixture(scope="module")
def hybrid_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid_spec")
    return {arch: make_hybrid_checkpoint(arch, root / arch)
            for arch in ("qwen3_5", "qwen3_next", "qwen3_5_moe")}


def prompts_for(n: int = 3, seed: int = 3) -> list[list[int]]:
    base = random_prompts(n, [20, 30, 25, 40][:n], VOCAB, seed=seed)
    return [p + p[:10] + p for p in base]


def make_llm(path, spec: dict | None = None, **options) -> LLM:
    options.setdefault("num_pages", 4096 // options.get("page_size", 1))
    return LLM(str(path), device=TEST_DEVICE, dtype="float32", speculative_config=spec,
               **options)


def generate(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    outs = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    llm.scheduler.check_integrity()
    return outs


def with_oracle(path, prompts, baseline, **options) -> LLM:
    llm = make_llm(path, {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False},
                   **options)
    llm.scheduler.spec.proposer = Oracle({tuple(p): p + o for p, o in zip(prompts, baseline)})
    return llm


def snapshots(llm: LLM) -> dict[tuple[int, ...], list[torch.Tensor]]:
    """The prefix cache's state snapshots by the tokens they follow: every layer's conv and
    delta-rule state."""
    cache = llm.scheduler.cache.prefix_cache
    pool = llm.scheduler.engine.state_pool
    result = {}
    for node, slot in cache._snapshots.items():
        key, n = [], node
        while n.parent is not None:
            key[:0] = n.key
            n = n.parent
        result[tuple(key)] = [t[slot].clone() for t in pool.conv + pool.ssm]
    return result


@pytest.mark.parametrize("arch, page_size", [("qwen3_5", 1),
                                             pytest.param("qwen3_5", 16, marks=pytest.mark.slow),
                                             pytest.param("qwen3_next", 16, marks=pytest.mark.slow),
                                             pytest.param("qwen3_5_moe", 1,
                                                          marks=pytest.mark.slow)])
def test_greedy_equals_no_speculation(hybrid_checkpoints, arch, page_size):
    path, prompts = hybrid_checkpoints[arch], prompts_for()
    base = make_llm(path, page_size=page_size)
    expected = generate(base, prompts)
    llm = with_oracle(path, prompts, expected, page_size=page_size)
    assert generate(llm, prompts) == expected
    stats = llm.scheduler.spec.stats
    # every draft position is rejected at some step, and most drafts are accepted
    assert stats.verify_steps > 10 and stats.draft_tokens / 2 < stats.accepted_tokens
    assert stats.accepted_tokens < stats.draft_tokens
    # the snapshots the prefix cache keeps are the states it keeps without speculation
    ours, theirs = snapshots(llm), snapshots(base)
    assert ours.keys() == theirs.keys() and (ours or page_size > 1)
    for key in ours:
        for a, b in zip(ours[key], theirs[key]):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    base.close()
    llm.close()


@pytest.mark.slow
def test_the_accepted_state_is_what_resumes(hybrid_checkpoints):
    """The negative control: without copying the accepted position's state back, a rejection
    resumes from a stale state and the outputs change."""
    path, prompts = hybrid_checkpoints["qwen3_5"], prompts_for()
    expected = generate(make_llm(path), prompts)
    llm = with_oracle(path, prompts, expected)
    state = next(g for g in llm.scheduler.cache.groups if isinstance(g, RecurrentStateManager))
    state._moves = _Discard()
    assert generate(llm, prompts) != expected


class _Discard(list):
    def append(self, item) -> None:
        pass


@pytest.mark.slow
def test_radix_hits_chunked_prefill_stops_and_suffix(hybrid_checkpoints):
    """Prompts sharing prefixes, fed in chunks of 16 tokens, twice (the second time from the
    prefix cache, the suffix tree drafting the first pass's outputs); then stop tokens end
    requests inside accepted runs, and the states kept at their ends are the right ones."""
    path = hybrid_checkpoints["qwen3_5"]
    prompts = prompts_for()
    prompts = prompts + [prompts[0][:32] + prompts[1][:20]]
    options = dict(page_size=4, max_prefill_tokens=16, max_num_batched_tokens=24)
    base = make_llm(path, **options)
    expected = generate(base, prompts)
    # adaptive off: the measured step costs would make how many drafts are accepted vary
    llm = make_llm(path, {"method": "suffix", "num_speculative_tokens": 4, "adaptive": False},
                   **options)
    assert generate(llm, prompts) == expected
    hits = llm.scheduler.cache.num_hit_tokens
    assert generate(llm, prompts) == expected
    stats = llm.scheduler.spec.stats
    assert llm.scheduler.cache.num_hit_tokens > hits and stats.accepted_tokens > 20
    base.close()
    llm.close()
    # stops inside accepted runs, page size 1 (state snapshots at any length)
    base = make_llm(path)
    llm = make_llm(path, {"method": "suffix", "num_speculative_tokens": 4, "adaptive": False})
    generate(llm, prompts)  # the suffix tree learns the outputs; the prefix cache forgets them
    llm.scheduler.cache.flush_prefix_cache()
    spec, cache = llm.scheduler.spec, llm.scheduler.cache
    accepted, cut = {}, []  # per verify feed its accepted drafts; whether a stop cut its run
    judge, commit_many = spec.judge, cache.commit_many
    spec.judge = lambda feed, tokens: accepted.setdefault(id(feed), judge(feed, tokens))
    cache.commit_many = lambda kept: (
        cut.extend(n < feed.cached_len + 1 + accepted[id(feed)] for _, n, feed in kept),
        commit_many(kept))
    for at in (6, 12):  # drafts never pass max_tokens: stop tokens cut runs
        stops = [o[at] for o in expected]
        params = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=stops)
        short = [o[: next(i for i, t in enumerate(o) if t in stops) + 1] for o in expected]
        assert generate(llm, prompts, params) == generate(base, prompts, params) == short
    assert any(cut)
    ours, theirs = snapshots(llm), snapshots(base)
    for key in ours.keys() & theirs.keys():
        for a, b in zip(ours[key], theirs[key]):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    base.close()
    llm.close()
