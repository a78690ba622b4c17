"""MTP and EAGLE-3 with CUDA graphs (GPU).

Decode graphs: they hand the draft head its rows as the eager forward does
(``GraphRunner(keep=True)``), a non-recurrent target's verify steps replay them as rows, and
greedy tokens are those without speculation. Requests of different lengths, speculating only once
at most two run (``disable_by_batch_size``): the plain decode steps before replay the graphs, and
the head drafts from the rows they kept.

The head's own graphs (``engine/head_graph.py``): with up to four requests drafting together, the
chained steps replay graphs of 1, 2 and 4 rows (three rows padded to four) and draft what the
eager steps draft, float32 on the Triton backend; a proposer made again replays the graphs
captured first. bf16 on FlashInfer (no float32 there): almost all the same drafts."""

from __future__ import annotations

import importlib.util

import pytest

from helpers.eagle3_drafts import VOCAB, eagle3_spec, make_checkpoints, make_draft
from helpers.hf_models import make_tiny_checkpoint, random_prompts
from helpers.hybrid_models import add_mtp_head, make_hybrid_checkpoint
from helpers.spec_spy import spy_on_proposer
from minisgl import LLM, SamplingParams
from minisgl.speculative.head import HeadProposer

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


needs_fla = pytest.mark.skipif(importlib.util.find_spec("fla") is None,
                               reason="hybrid models on CUDA need fla-core")


@needs_fla
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


def proposer_of(llm: LLM) -> HeadProposer:
    spec = llm.scheduler.spec
    assert spec is not None and isinstance(spec.proposer, HeadProposer)
    return spec.proposer


def head_replays(llm: LLM) -> list[int]:
    """The rows of every chain step the head's graphs replay, from now on; first, a proposer made
    again (``SpecDecoder.reset``, as after the warm-up) replays the graphs captured before."""
    runner = llm.scheduler.engine.head_graphs
    assert runner is not None and runner.graphs
    assert proposer_of(llm).graphs is runner
    llm.scheduler.spec.reset()  # type: ignore[union-attr]
    assert proposer_of(llm).graphs is runner
    rows, replay = [], runner.replay

    def spy(feeds, tokens, hidden):
        rows.append(len(feeds))
        return replay(feeds, tokens, hidden)

    runner.replay = spy
    return rows


def drafts(path, spec: dict, head_graphs: bool, reqs, **options):
    """Outputs, every drafting request's (tokens, drafts), and the rows of every replayed chain
    step, with the head's graphs replayed or not (``proposer.graphs = None``: eager chain steps;
    the decode graphs on either way), up to four requests drafting together."""
    options = {"dtype": "float32", "num_pages": 4096, "cuda_graph_max_bs": 16,
               "warmup": "off"} | options
    llm = LLM(str(path), device="cuda", speculative_config=spec | {"disable_by_batch_size": 4},
              **options)
    rows = head_replays(llm) if head_graphs else []
    if not head_graphs:
        proposer_of(llm).graphs = None
    _, calls = spy_on_proposer(proposer_of(llm))
    outs = generate(llm, reqs)
    llm.scheduler.check_integrity()
    llm.close()
    return outs, calls, rows


def check_same_drafts(path, spec: dict, reqs) -> None:
    base = make_llm(path)
    expected = generate(base, reqs)
    base.close()
    outs, calls, _ = drafts(path, spec, False, reqs)
    graph_outs, graph_calls, rows = drafts(path, spec, True, reqs)
    assert sum(1 for _, d in calls if d) > 10
    assert graph_calls == calls
    assert graph_outs == outs == expected
    assert 3 in rows and set(rows) <= {1, 2, 3, 4}  # captured: 1, 2, 4


def test_eagle3_head_graphs_draft_what_eager_steps_draft(tmp_path):
    target, draft = make_checkpoints(tmp_path, names=("llama",))["llama"]
    check_same_drafts(target, eagle3_spec(draft, k=4), prompts(VOCAB))


@needs_fla
def test_mtp_head_graphs_draft_what_eager_steps_draft(tmp_path):
    path = make_hybrid_checkpoint("qwen3_5", tmp_path / "qwen3_5")
    add_mtp_head(path)
    spec = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}
    check_same_drafts(path, spec, prompts(256))


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                    reason="flashinfer is not installed (pip install -e '.[flashinfer]')")
def test_eagle3_head_graphs_on_flashinfer(tmp_path):
    """The head's graphs replan FlashInfer's graph wrappers of their size before each replay
    (``plan_replay``), wrappers the decode graphs of that size may share (a head of the
    target's heads and head size, as here): the drafts are the eager steps', but for the few a
    bf16 rounding of a padded step may flip."""
    target = make_tiny_checkpoint("llama", tmp_path / "target", num_kv_heads=1, head_dim=128,
                                  num_hidden_layers=4)
    heads = {"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128}
    draft = make_draft(tmp_path / "draft", target, heads=(4, 1, 128), config=heads)
    spec, reqs = eagle3_spec(draft, k=4), prompts(VOCAB)
    options = dict(dtype="bfloat16", attn="fi")
    _, calls, _ = drafts(target, spec, False, reqs, **options)
    _, graph_calls, rows = drafts(target, spec, True, reqs, **options)
    # the same tokens drafted from (a flipped draft is rejected like the other, so the runs
    # stay aligned; a flipped verdict would part them, and such calls are not compared)
    pairs = [(a, b) for (ids, a), (ids2, b) in zip(calls, graph_calls) if ids == ids2 and a and b]
    same = sum(x == y for a, b in pairs for x, y in zip(a, b))
    assert len(pairs) > 10 and same >= 0.9 * sum(len(a) for a, _ in pairs)
    assert 3 in rows
