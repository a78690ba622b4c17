"""The MXFP4 MoE backends of outside libraries (OpenAI's triton_kernels, ``moe/matmul_ogs.py``;
FlashInfer's CUTLASS fused MoE, ``moe/flashinfer_mxfp4.py``) against the torch reference, which
dequantizes each routed expert: gpt-oss-20b's expert shapes (32 experts of 2,880 x 2,880, top 4,
biases, the clamped SwiGLU) at one token, a few, a decode batch's and a prefill's, with the
engine's own routing, and replayed from a CUDA graph. Both read the same e2m1 weights; the
reference runs float32 GEMMs on bf16 inputs and rounds once, the kernels sum in float32 but round
h to bf16 between the GEMMs: about 2^-8 of h's size an element, which the down GEMM's 2,880-term
sums average out to under 1% of the output's largest value (measured 0.6-1.0% for triton_kernels
against the fused MoE, benchmark/results/H200/kernel_moe_triton_kernels.md): the bound is 2%."""

from __future__ import annotations

import importlib

import pytest
import torch

from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales, create_moe_backend
from minisgl.moe.fused import WordExperts
from minisgl.moe.reference import TorchMoeBackend
from minisgl.quant.mxfp4 import quantize_mxfp4

E, K, H, INTER = 32, 4, 2880, 2880
ACT = MoeActivation("swiglu_clamped", 1.702, 7.0)
# backend -> (the module it imports, the extra that installs it)
LIBRARIES = {"triton_kernels": ("triton_kernels.matmul_ogs", "triton-kernels"),
             "flashinfer": ("flashinfer.fused_moe", "flashinfer")}


@pytest.mark.parametrize("backend", list(LIBRARIES))
def test_without_the_package_the_error_says_what_to_install(backend):
    module, extra = LIBRARIES[backend]
    try:
        importlib.import_module(module)
    except ImportError:
        with pytest.raises(ImportError, match=rf"minisgl\[{extra}\]"):
            create_moe_backend(backend)
    else:
        pytest.skip(f"{module} is installed")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 64, 300])
@pytest.mark.parametrize("backend", list(LIBRARIES))
def test_matches_the_dequantized_reference(backend, tokens):
    pytest.importorskip(LIBRARIES[backend][0])
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("these MXFP4 layouts are Hopper's")
    g = torch.Generator(device="cuda").manual_seed(tokens)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device="cuda") * scale

    (w13, s13), (w2, s2) = quantize_mxfp4(randn(E, 2 * INTER, H, scale=H**-0.5)), \
        quantize_mxfp4(randn(E, H, INTER, scale=INTER**-0.5))
    bias = ExpertBias(randn(E, 2 * INTER, scale=0.1).bfloat16(), randn(E, H, scale=0.1).bfloat16())
    x = randn(tokens, H).bfloat16()
    weights, ids = torch.topk(randn(tokens, E).softmax(-1), K, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).bfloat16()
    scales = Mxfp4Scales(s13, s2)
    moe = create_moe_backend(backend)
    layout = moe.prepare_experts(w13, w2, scales, bias, ACT)
    assert layout is not None and not isinstance(layout, WordExperts)  # the library's own
    packed = sum(t.numel() * t.element_size() for t in (w13, w2, s13, s2, *bias))
    # the weights' bytes count the layout (Hopper layouts may pad a dimension: FlashInfer's
    # 2,880 to 3,072; triton_kernels' biases in fp32)
    assert packed <= layout.nbytes <= 1.25 * packed
    got = moe.forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT, layout=layout)
    want = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT)
    assert got.shape == want.shape == (tokens, H) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(),
                               atol=2e-2 * float(want.float().abs().max()), rtol=0)
    graph = torch.cuda.CUDAGraph()  # no host sync: a decode step captures it
    with torch.cuda.graph(graph):
        captured = moe.forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT,
                               layout=layout)
    graph.replay()
    torch.testing.assert_close(captured, got, atol=0, rtol=0)
