"""Programmatic dependent launch (``kernel/triton/pdl.py``): off wherever it cannot run, compiled
into every decode kernel for sm_90, and on a Hopper GPU the same tokens and logits as without it."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

import_triton()

from helpers.hf_models import random_prompts  # noqa: E402
from helpers.hopper_compile import compile_for_hopper  # noqa: E402
from minisgl import LLM, SamplingParams  # noqa: E402
from minisgl.kernel.triton import pdl  # noqa: E402

pytestmark = pytest.mark.any_device

def test_off_on_cpu_and_in_the_interpreter():
    assert pdl.launch_options(torch.zeros(1), True) == {"USE_PDL": False}
    assert not pdl.pdl_enabled(torch.zeros(1), True)


def test_the_engine_hands_its_choice_to_every_launcher(tiny_checkpoints):
    """``disable_pdl`` reaches each layer that launches a PDL kernel and the attention backend
    (on CPU too, where the launchers then run no kernel)."""
    from minisgl.attention.base import BaseAttnBackend

    for off in (False, True):
        with LLM(str(tiny_checkpoints["llama"]), device="cpu", disable_pdl=off) as llm:
            engine = llm.scheduler.engine
            holders = [m for m in engine.model.modules() if hasattr(m, "pdl")]
            kinds = {type(m).__name__ for m in holders}
            assert {"AttentionLayer", "LinearQKVMerged", "LinearRowParallel"} <= kinds
            assert any(kind.startswith("RMSNorm") for kind in kinds)
            assert all(m.pdl is not off for m in holders)
            assert isinstance(engine.attn_backend, BaseAttnBackend)
            assert engine.attn_backend.pdl is not off


def test_decode_kernels_compile_with_pdl_for_hopper(tmp_path):
    """The GEMV (plain, gated), the norm (plain, quantizing for an FP8 layer), the attention
    reduction, the greedy sampler's two kernels and the MoE's router, alignment and top-k sum
    (the FP8 suite compiles the GEMV for FP8 weights, RoPE and the attention's first stage with
    PDL too, the MXFP4 one the MoE GEMMs): sm_90 cubins whose PTX waits on the grid before."""
    cubins = compile_for_hopper(tmp_path, "pdl")
    assert len(cubins) == 13 and all(line.endswith("griddepcontrol") for line in cubins), cubins


def _decode(path: str, pdl_on: bool) -> tuple[list[list[int]], list[torch.Tensor]]:
    llm = LLM(path, device="cuda", dtype="bfloat16", num_pages=2048, disable_pdl=not pdl_on)
    engine, logits = llm.scheduler.engine, []
    forward = engine.forward

    def recorded(batch, args):
        out = forward(batch, args)
        logits.append(out.logits.clone())
        return out

    engine.forward = recorded
    prompts = random_prompts(4, [5, 40, 1, 90], 256, seed=5)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (8, 16, 24, 40)]
    tokens = [o.token_ids for o in llm.generate(prompts, params)]
    llm.close()
    return tokens, logits


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_pdl_gives_the_same_tokens_and_logits(arch, tiny_checkpoints):
    """Batched steps, then one request decoding alone (its last 16 tokens), CUDA graphs on: the
    same kernels and the same arithmetic, so the same bits; only when kernels start differs."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs compute capability 9.0")
    path = str(tiny_checkpoints[arch])
    tokens, logits = _decode(path, True)
    ref_tokens, ref_logits = _decode(path, False)
    assert tokens == ref_tokens
    assert len(logits) == len(ref_logits) >= 40
    assert sum(out.shape[0] == 1 for out in logits) >= 16  # batch-1 decode steps (the GEMVs)
    for got, want in zip(logits, ref_logits):
        assert torch.equal(got, want)
