"""Rejection sampling with a one-hot proposal keeps the target distribution (statistical tests).

A verified position draws its token with the request's seed exactly as it would without
speculation, and accepts the draft ``t`` when the draw is ``t``: acceptance happens with
probability p(t), and a rejection leaves a token distributed as p with ``t`` removed and
renormalised, which is what standard speculative sampling prescribes. Checked on the real sampler
over many seeds, and end to end on a tiny model against runs without speculation.
"""

from __future__ import annotations

import pytest
import torch

from helpers.device import TEST_DEVICE
from minisgl import LLM, SamplingParams
from minisgl.core import Req
from minisgl.sampling import BatchSamplingArgs, sample

pytestmark = pytest.mark.any_device


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a / a.sum() - b / b.sum()).abs().sum().item()


def test_acceptance_is_p_of_the_draft_and_rejections_follow_the_residual():
    vocab, n, draft = 16, 20000, 3
    p = torch.tensor([0.05, 0.1, 0.05, 0.3, 0.2, 0.1, 0.1, 0.1] + [0.0] * 8)
    logits = p.clamp(min=1e-30).log().expand(n, vocab).contiguous()
    params = SamplingParams(temperature=1.0)
    reqs = [Req(uid=i, input_ids=[1, 2], prompt_len=2, sampling_params=params,
                max_device_len=8, device_len=2, seed=1000 + i) for i in range(n)]
    args = BatchSamplingArgs.from_reqs(reqs, vocab, torch.device("cpu"), steps=[4] * n)
    tokens = sample(logits, args, "torch").next_tokens
    accepted = tokens == draft
    assert accepted.float().mean().item() == pytest.approx(p[draft].item(), abs=0.015)
    residual = p.clone()
    residual[draft] = 0
    counts = torch.bincount(tokens[~accepted], minlength=vocab).float()
    assert _tv(counts, residual) < 0.02
    assert _tv(torch.bincount(tokens, minlength=vocab).float(), p) < 0.02


def test_sampled_outputs_keep_their_distribution(tiny_checkpoints):
    """Many unseeded requests with and without speculation (independent draws): the tokens at a
    verified position have the same distribution (two-sample total variation)."""
    prompt = [7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8, 9]
    n, at = 600, 12
    counts = []
    for config, offset in ((None, 0), ({"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_min": 1, "adaptive": False,
                                        "disable_by_batch_size": 1000}, 10**6)):
        llm = LLM(str(tiny_checkpoints["llama"]), device=TEST_DEVICE, dtype="float32",
                  num_pages=16384, max_running_requests=600, speculative_config=config)
        params = [SamplingParams(temperature=0.3, max_tokens=at + 1, ignore_eos=True,
                                 seed=seed + offset) for seed in range(n)]
        outs = llm.generate([prompt] * n, params)
        counts.append(torch.bincount(torch.tensor([o.token_ids[at] for o in outs]),
                                     minlength=256).float())
        if config is not None:
            stats = llm.scheduler.spec.stats
            assert stats.verify_steps > 100 and stats.accepted_tokens > 50
        llm.close()
    assert _tv(counts[0], counts[1]) < 0.1
