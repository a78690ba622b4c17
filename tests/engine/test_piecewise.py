"""Piecewise CUDA graphs (GPU only): prefill and mixed forwards replayed from graphs, attention run
eagerly between them, against the same forwards run eagerly."""

from __future__ import annotations

import pytest
import torch

from helpers.hf_models import random_prompts
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.gpu

VOCAB = 256
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def _run(path: str, piecewise: int, **options) -> tuple[list[list[int]], list[torch.Tensor], int]:
    """Greedy tokens of a burst of prompts under mixed steps with a small budget (chunks, decode
    rows and prefill rows together), the logits of every prefill or mixed forward, and how many of
    them replayed piecewise graphs."""
    llm = LLM(path, device="cuda", dtype="float32", num_pages=2048, max_prefill_tokens=96,
              max_num_batched_tokens=96, piecewise_cuda_graph_max_tokens=piecewise, **options)
    engine = llm.scheduler.engine
    logits, replays = [], [0]
    forward = engine.forward
    if engine.piecewise is not None:
        piece_forward = engine.piecewise.forward

        def counted(batch):
            replays[0] += 1
            return piece_forward(batch)

        engine.piecewise.forward = counted

    def recorded(batch, args):
        out = forward(batch, args)
        if not batch.is_decode:
            logits.append(out.logits.clone())
        return out

    engine.forward = recorded
    prompts = random_prompts(8, [5, 17, 33, 60, 90, 130, 200, 7], VOCAB, seed=3)
    tokens = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    llm.close()
    return tokens, logits, replays[0]


@pytest.mark.parametrize("arch,options", [("llama", {}), ("qwen3", {"page_size": 16}),
                                          ("qwen3_moe", {}), ("qwen3", {"disable_overlap": True})])
def test_piecewise_graphs_give_the_eager_forwards(arch, options, tiny_checkpoints):
    """Graphs of 64 and 128 tokens replay every prefill/mixed step (their token counts padded);
    tokens are equal and logits within fp32 rounding of the eager forwards'."""
    path = str(tiny_checkpoints[arch])
    eager_tokens, eager_logits, none = _run(path, 0, **options)
    tokens, logits, replays = _run(path, 128, **options)
    assert none == 0 and replays == len(logits) > 5
    assert tokens == eager_tokens
    assert len(logits) == len(eager_logits)
    for got, want in zip(logits, eager_logits):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_piecewise_sizes_follow_the_step_budget(tiny_checkpoints):
    """Sizes are the multiples of 64 up to the option, capped by the largest forward (its budget);
    0 turns them off."""
    path = str(tiny_checkpoints["qwen3"])
    llm = LLM(path, device="cuda", dtype="float32", num_pages=512, max_prefill_tokens=150,
              max_num_batched_tokens=150, max_running_requests=8)
    assert llm.scheduler.engine.piecewise.sizes == [64, 128, 192]
    llm.close()
    llm = LLM(path, device="cuda", dtype="float32", num_pages=512,
              piecewise_cuda_graph_max_tokens=0)
    assert llm.scheduler.engine.piecewise is None
    llm.close()


def test_a_size_whose_kernel_is_not_loaded_is_captured_after_an_eager_run(tiny_checkpoints):
    """``capture(loaded=True)`` runs only the largest size eagerly; a smaller size that launches a
    kernel not yet loaded (no module may load while a stream captures) is run eagerly and
    captured again, and its graph launches that kernel."""
    import triton
    import triton.language as tl

    from minisgl.engine.piecewise import PiecewiseRunner

    @triton.jit
    def _mark(ptr, VALUE: tl.constexpr):
        tl.store(ptr, VALUE)

    llm = LLM(str(tiny_checkpoints["qwen3"]), device="cuda", dtype="float32", num_pages=512,
              max_prefill_tokens=128, max_num_batched_tokens=128, max_running_requests=8)
    engine = llm.scheduler.engine
    mark = torch.zeros(1, dtype=torch.int32, device="cuda")
    forward = engine.model.forward

    def marked(input_ids, positions, ctx):
        if input_ids.shape[0] == 64:  # only the smaller size launches it
            _mark[(1,)](mark, VALUE=7)
        return forward(input_ids, positions, ctx)

    engine.model.forward = marked
    runner = PiecewiseRunner(engine.model, engine.ctx, 128)
    eager: list[int] = []
    run_cut = runner._run_cut

    def counted(size, capture):
        if not capture:
            eager.append(size)
        return run_cut(size, capture)

    runner._run_cut = counted
    runner.capture(loaded=True)
    assert eager == [128, 64]
    graphs, _, _ = runner.pieces[64]
    graphs[0].replay()  # the embedding and layer 0 up to its attention, after the mark
    torch.cuda.synchronize()
    assert mark.item() == 7
    runner.close()
    llm.close()
