"""The sliding layers' own pages under speculation, on CPU with fabricated engine output
(``helpers/fake_target.py``): a tiny Gemma 3 (window of 8 tokens) decoding far past its window,
its drafts sometimes rejected. A request holds the sliding pages of its window and of the step
being fed, never more; the pages of rejected drafts go back with the rest; when everyone is done
both pools are whole."""

from __future__ import annotations

import pytest

from helpers.fake_target import ScriptProposer, run, scripted_forward, scripts
from helpers.gemma_models import WINDOW, make_gemma_checkpoint
from helpers.hf_models import random_prompts
from minisgl import LLM, SamplingParams

PAGE = 2
K = 3


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return make_gemma_checkpoint("gemma3", tmp_path_factory.mktemp("gemma") / "gemma3")


@pytest.mark.parametrize("overlap", [True, False])
def test_window_pages_past_the_window_are_freed(gemma, overlap):
    prompts = random_prompts(3, [11, 20, 7], 200, seed=6)
    script = scripts(prompts, 48)
    llm = LLM(str(gemma), device="cpu", dtype="float32", page_size=PAGE, num_pages=512,
              cache="naive", sliding_pool_ratio=0.5, disable_overlap=not overlap,
              speculative_config={"method": "ngram", "num_speculative_tokens": K,
                                  "adaptive": False})
    sched = llm.scheduler
    sched.spec.proposer = ScriptProposer(script, lambda uid, pos: pos % 5 == 0)
    scripted_forward(sched, script)
    window = sched.cache.window
    # the window, the page it starts inside, a step's k + 1 tokens and the page they end inside
    most = WINDOW + PAGE + (K + 1) + PAGE

    def rules() -> None:
        sched.check_integrity()
        held = window.num_tokens - window.free_tokens
        running = [r for r in sched.reqs.values() if r.table_idx >= 0]
        assert held <= len(running) * most

    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    tokens = run(sched, prompts, params, rules)
    assert tokens == {uid: s[len(prompts[uid]):] for uid, s in script.items()}
    assert sched.spec.stats.accepted_tokens < sched.spec.stats.draft_tokens
    assert window.free_tokens == window.num_tokens
    assert sched.cache.available_tokens == sched.cache.num_tokens
    llm.close()
