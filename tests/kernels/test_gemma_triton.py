"""Gemma 3 and Gemma 4 through the Triton attention backend (the Triton interpreter on CPU): the
windowed decode and extend kernels inside the real model, with and without the sliding layers' own
page table, give transformers' greedy tokens."""

from __future__ import annotations

import dataclasses

import pytest

from helpers.interpreter import import_triton

triton = import_triton()

from helpers.device import TEST_DEVICE
from helpers.gemma_models import make_gemma_checkpoint
from helpers.hf_models import hf_greedy, random_prompts
from minisgl import LLM, SamplingParams

pytestmark = [pytest.mark.any_device, pytest.mark.slow]


@pytest.mark.parametrize("arch,ratio", [("gemma3", 0.0), ("gemma3", 0.1), ("gemma4", 0.1)])
def test_triton_backend_matches_transformers(tmp_path_factory, arch, ratio):
    """Gemma 4: its global layers' head size (32) and KV heads (1) beside the local layers'."""
    path = str(make_gemma_checkpoint(arch, tmp_path_factory.mktemp(arch)))
    prompts = random_prompts(2, [13, 30], 256, seed=3)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = LLM(path, device=TEST_DEVICE, dtype="float32", attn="triton", page_size=4,
              num_pages=256, max_prefill_tokens=16, sliding_pool_ratio=ratio, cache="naive")
    outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == hf_greedy(path, prompts, 24)
    llm.scheduler.check_integrity()


def test_proportional_rotary_one_table_for_every_global_layer():
    """Gemma 4 26B-A4B has five global layers: a table per layer (a cache of four, keyed by the
    module) made the fifth layer copy its table host-to-device inside CUDA-graph capture. One
    table per config serves them all."""
    import torch

    from minisgl.layers.rotary import RotaryEmbedding, _cos_sin_cache
    from minisgl.models.config import RotaryConfig

    cfg = RotaryConfig(64, 1e6, 128, scaling=(("partial_rotary_factor", 0.25),
                                              ("rope_type", "proportional")))
    _cos_sin_cache.cache_clear()
    layers = [RotaryEmbedding(RotaryConfig(*dataclasses.astuple(cfg))) for _ in range(6)]
    q, k = torch.randn(3, 2, 64), torch.randn(3, 1, 64)
    pos = torch.tensor([0, 5, 127])
    outs = [layer(pos, q, k) for layer in layers]
    assert _cos_sin_cache.cache_info().currsize == 1
    assert all(torch.equal(o[0], outs[0][0]) for o in outs)
    # three quarters of the frequencies are zero: dims 8..31 and 40..63 pass through
    assert torch.equal(outs[0][0][..., 8:32], q[..., 8:32])
    assert not torch.equal(outs[0][0][1:, :, :8], q[1:, :, :8])
