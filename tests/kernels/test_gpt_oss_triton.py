"""gpt-oss through the Triton kernels (the Triton interpreter on CPU): the fused MoE with its
MXFP4 GEMMs, biases and clamped SwiGLU, and the attention kernels with sinks and a window, inside
the real model, give transformers' greedy tokens on the dequantized weights."""

from __future__ import annotations

import pytest

from helpers.interpreter import import_triton

triton = import_triton()

from helpers.device import TEST_DEVICE  # noqa: E402
from helpers.gpt_oss_models import make_gpt_oss_checkpoint, make_mxfp4_pair  # noqa: E402
from helpers.hf_models import hf_greedy, random_prompts  # noqa: E402
from minisgl import LLM, SamplingParams  # noqa: E402

pytestmark = [pytest.mark.any_device, pytest.mark.slow]


@pytest.mark.parametrize("name", ["fp32", "mxfp4"])
def test_triton_kernels_match_transformers(tmp_path_factory, name):
    root = tmp_path_factory.mktemp("gpt_oss")
    fp32 = make_gpt_oss_checkpoint(root / "fp32")
    mx, ref = make_mxfp4_pair(fp32, root / "mxfp4", root / "dequantized")
    path, ref_path = (fp32, fp32) if name == "fp32" else (mx, ref)
    prompts = random_prompts(2, [13, 30], 256, seed=3)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm = LLM(str(path), device=TEST_DEVICE, dtype="float32", attn="triton", moe_backend="triton",
              page_size=4, num_pages=256, max_prefill_tokens=16)
    outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == hf_greedy(ref_path, prompts, 16)
    llm.scheduler.check_integrity()
