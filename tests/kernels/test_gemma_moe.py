"""Gemma 4's experts on the fused MoE kernel: the GELU-tanh gated activation in GEMM 1's epilogue
against the torch backend and a dense float32 truth, and a tiny Gemma 4 whose experts run on the
kernel giving transformers' greedy tokens.

Without a GPU the kernels run under the Triton interpreter (float32/float16: the interpreter's
bf16 dot is wrong); on CUDA the same tests run compiled.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton.fused_moe import fused_moe  # noqa: E402
from minisgl.moe import MoeActivation  # noqa: E402
from minisgl.moe.reference import TorchMoeBackend  # noqa: E402

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"
GELU = MoeActivation("gelu_tanh")


def inputs(tokens, hidden, inter, experts, top_k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g) * 2  # gates well past GELU's bend
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
    values, ids = torch.topk(torch.randn(tokens, experts, generator=g), top_k, dim=-1)
    cast = lambda t: t.to(DEV, dtype)  # noqa: E731
    return cast(x), cast(w13), cast(w2), cast(values.softmax(-1)), ids.to(DEV)


def truth(x, w13, w2, weights, ids) -> torch.Tensor:
    x, w13, w2, weights = x.double(), w13.double(), w2.double(), weights.double()
    gate, up = torch.einsum("th,tkih->tki", x, w13[ids]).chunk(2, dim=-1)
    act = F.gelu(gate, approximate="tanh") * up
    return torch.einsum("tki,tkhi->th", act * weights[..., None], w2[ids])


@pytest.mark.parametrize("tokens", [1, 9, 40])
def test_gelu_tanh_fp32(tokens):
    args = inputs(tokens, 64, 48, 6, 2, torch.float32, seed=tokens)
    out = fused_moe(*args, act=GELU)
    torch.testing.assert_close(out.double(), truth(*args), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, TorchMoeBackend().forward(*args, act=GELU), rtol=1e-4,
                               atol=1e-4)
    silu = fused_moe(*args)
    assert (silu - out).abs().max() > 1e-2  # the activation argument is honoured


def test_gelu_tanh_fp16_rounds_like_the_reference():
    args = inputs(17, 64, 32, 8, 2, torch.float16, seed=3)
    out = fused_moe(*args, act=GELU)
    torch.testing.assert_close(out, TorchMoeBackend().forward(*args, act=GELU), rtol=5e-3,
                               atol=5e-3)
    torch.testing.assert_close(out.double(), truth(*args), rtol=5e-3, atol=5e-3)


def test_gemma4_on_the_fused_kernel(tmp_path):
    """Every MoE block of the tiny Gemma 4 (4 experts, top 2) through the Triton backend."""
    from helpers.gemma_models import make_gemma_checkpoint
    from helpers.hf_models import hf_greedy, random_prompts
    from minisgl import LLM, SamplingParams
    from minisgl.moe.fused import TritonMoeBackend

    path = str(make_gemma_checkpoint("gemma4", tmp_path / "gemma4"))
    prompts = random_prompts(2, [5, 19], 256, seed=4)
    llm = LLM(path, device=DEV, dtype="float32", num_pages=512, moe_backend="triton")
    moes = [m.moe for m in llm.scheduler.engine.model.modules() if hasattr(m, "moe")]
    assert moes and all(isinstance(m.backend, TritonMoeBackend) for m in moes)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == hf_greedy(path, prompts, 8)
