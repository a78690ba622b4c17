"""The batched draft head (``speculative/head.py``) drafts what the per-request chain drafts:
requests of different lengths drafting together, on the engine's paged pool, run twice (the
second time each prompt is a prefix-cache hit on its own first run) or with a pool small enough to
retract requests; every request's drafts at every step equal those of a plain-torch chain over
the request alone (``helpers/eagle3_drafts.reference_drafts``: dense K/V, float32), fed the
target's rows of its whole history."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from helpers.device import TEST_DEVICE
from helpers.eagle3_drafts import VOCAB, eagle3_spec, make_checkpoints, reference_drafts
from helpers.hf_models import random_prompts
from helpers.spec_spy import spy_on_proposer
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return make_checkpoints(tmp_path_factory.mktemp("eagle3"), names=("llama",))["llama"]


@pytest.mark.parametrize("num_pages, runs", [(4096, 2), (400, 1)], ids=["hits", "retraction"])
def test_batched_drafts_equal_the_per_request_chain(checkpoints, num_pages, runs):
    target, draft = checkpoints
    prompts = random_prompts(6, [40, 66, 54, 80, 30, 60], VOCAB, seed=8)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    llm = LLM(str(target), device=TEST_DEVICE, dtype="float32", num_pages=num_pages,
              speculative_config=eagle3_spec(draft, k=4))
    proposer = llm.scheduler.spec.proposer
    rows, calls = spy_on_proposer(proposer, by_prefix=True)
    sizes: list[int] = []
    spied = proposer.propose_many

    def count(reqs, max_lens):
        sizes.append(len(reqs))
        return spied(reqs, max_lens)

    proposer.propose_many = count
    for _ in range(runs):
        llm.generate(prompts, params)
    llm.scheduler.check_integrity()
    if runs > 1:
        assert llm.scheduler.cache.num_hit_tokens > 0
    else:
        assert llm.scheduler.num_retractions > 0
    llm.close()
    assert max(sizes) > 1  # steps drafted for several requests in one batch
    w = load_file(str(draft / "model.safetensors"))
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    drafted = [(ids, drafts) for ids, drafts in calls if drafts]
    assert len(drafted) > 30
    for ids, drafts in drafted:
        aux = torch.stack([rows[tuple(ids[: p + 1])] for p in range(len(ids) - 1)]).float().cpu()
        assert reference_drafts(w, embed, aux, ids, len(drafts)) == drafts
