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
