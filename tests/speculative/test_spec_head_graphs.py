"""MTP and EAGLE-3 with decode CUDA graphs (GPU): the graphs hand the draft head its rows as the
eager forward does (``GraphRunner(keep=True)``), a non-recurrent target's verify steps replay
them as rows, and greedy tokens are those without speculation. Requests of different lengths,
speculating only once at most two run (``disable_by_batch_size``): the plain decode steps before
replay the graphs, and the head drafts from the rows they kept."""

from __future__ import annotations

import importlib.util

import pytest

from helpers.eagle3_drafts import VOCAB, eagle3_spec, make_checkpoints
from helpers.hf_models import random_prompts
from helpers.hybrid_models import add_mtp_head, make_hybrid_checkpoint
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.gpu
PARAMS = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 20, 32, 40)]


def prompts(vocab: int) -> list[list[int]]:
    base = random_prompts(3, [20, 30, 25], vocab, seed=3)
    return [p + p[:10] + p for p in base] + [base[0] * 2 + base[1]]


def make_llm(path, spec=None, **options) -> LLM:
    if spec is not None:
        spec = spec | {"disable_by_batch_size": 2}
    return LLM(str(path), device="cuda", dtype="float32", num_pages=4096,
               speculative_config=spec, **options)


def generate(llm: LLM, reqs: list[list[int]]) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(reqs, PARAMS)]


def count_replays(llm: LLM) -> list[int]:
    """The batch sizes the decode graphs replay, from now on."""
    runner, sizes = llm.scheduler.engine.graph_runner, []
    assert runner is not None, "decode CUDA graphs are on with a draft head"
    replay = runner.replay

    def spy(batch, *args):
        sizes.append(batch.size)
        return replay(batch, *args)

    runner.replay = spy
    return sizes


@pytest.mark.parametrize("name", ["llama", "llama_echo"])
def test_eagle3_with_decode_graphs(tmp_path, name):
    target, draft = make_checkpoints(tmp_path, names=(name,))[name]
    reqs = prompts(VOCAB)
    base = make_llm(target)
    expected = generate(base, reqs)
    base.close()
    eager = make_llm(target, eagle3_spec(draft), cuda_graph_max_bs=0)
    assert generate(eager, reqs) == expected
    eager_stats = eager.scheduler.spec.stats
    eager.close()
    llm = make_llm(target, eagle3_spec(draft))
    replays = count_replays(llm)
    assert generate(llm, reqs) == expected
    stats = llm.scheduler.spec.stats
    assert stats.verify_steps > 5
    # verify steps run as rows through the graphs: more rows than the two requests
    assert replays and max(replays) > 2
    # the head drafts from the rows the graphs kept what it drafts from an eager forward's (the
    # echo draft accepts 2 of 72 here either way: its rows before speculation starts are few)
    assert (stats.draft_tokens, stats.accepted_tokens) == (eager_stats.draft_tokens,
                                                           eager_stats.accepted_tokens)
    llm.scheduler.check_integrity()
    llm.close()


@pytest.mark.skipif(importlib.util.find_spec("fla") is None,
                    reason="hybrid models on CUDA need fla-core")
def test_mtp_with_decode_graphs(tmp_path):
    path = make_hybrid_checkpoint("qwen3_5", tmp_path / "qwen3_5")
    add_mtp_head(path)
    reqs = prompts(256)
    base = make_llm(path)
    expected = generate(base, reqs)
    base.close()
    llm = make_llm(path, {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False})
    replays = count_replays(llm)
    assert generate(llm, reqs) == expected
    assert llm.scheduler.spec.stats.verify_steps > 5
    assert replays  # the plain decode steps (a recurrent model verifies eagerly)
    llm.scheduler.check_integrity()
    llm.close()
