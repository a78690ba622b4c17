"""OpenAI's triton_kernels as the MXFP4 MoE backend (``moe/matmul_ogs.py``) against the torch
reference, which dequantizes each routed expert: gpt-oss-20b's expert shapes (32 experts of
2,880 x 2,880, top 4, biases, the clamped SwiGLU) at one token, a few, a decode batch's and a
prefill's, with the engine's own routing. Both read the same e2m1 weights; the reference runs
float32 GEMMs on bf16 inputs and rounds once, the kernels sum in float32 but round h to bf16
between the GEMMs: about 2^-8 of h's size an element, which the down GEMM's 2,880-term sums
average out to under 1% of the output's largest value (measured 0.6-1.0% against the fused MoE,
benchmark/results/H200/kernel_moe_triton_kernels.md): the bound is 2%."""

from __future__ import annotations

import pytest
import torch

from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales, create_moe_backend
from minisgl.moe.reference import TorchMoeBackend
from minisgl.quant.mxfp4 import quantize_mxfp4

E, K, H, INTER = 32, 4, 2880, 2880
ACT = MoeActivation("swiglu_clamped", 1.702, 7.0)


def test_without_the_package_the_error_says_what_to_install():
    try:
        import triton_kernels  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"minisgl\[triton-kernels\]"):
            create_moe_backend("triton_kernels")
    else:
        pytest.skip("triton_kernels is installed")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 64, 300])
def test_matches_the_dequantized_reference(tokens):
    pytest.importorskip("triton_kernels")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("triton_kernels' MXFP4 layouts here are Hopper's")
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
    backend = create_moe_backend("triton_kernels")
    layout = backend.prepare_experts(w13, w2, scales, bias, ACT)
    assert layout is not None
    packed = sum(t.numel() * t.element_size() for t in (w13, w2, s13, s2, *bias))
    # the weights' bytes count the layout: the values, the scales padded, biases in fp32
    assert packed <= layout.nbytes <= 1.25 * packed  # (Hopper layouts may pad a dimension)
    got = backend.forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT, layout=layout)
    want = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT)
    assert got.shape == want.shape == (tokens, H) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(),
                               atol=2e-2 * float(want.float().abs().max()), rtol=0)
    graph = torch.cuda.CUDAGraph()  # no host sync: a decode step captures it
    with torch.cuda.graph(graph):
        captured = backend.forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT,
                                   layout=layout)
    graph.replay()
    torch.testing.assert_close(captured, got, atol=0, rtol=0)


@pytest.mark.any_device
def test_routing_sorts_the_pairs_by_expert():
    """The bitmap built from the engine's ids gives triton_kernels' metadata each expert's count
    and the routed pairs in expert order (stable), their weights gathered in that order."""
    pytest.importorskip("triton_kernels")
    from helpers.interpreter import import_triton

    import_triton()
    from minisgl.moe.matmul_ogs import routing

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    weights, ids = torch.topk(torch.randn(37, E, generator=gen).softmax(-1), K, dim=-1)
    ids[3] = torch.tensor([31, 0, 30, 1])  # bit 31 of a word: the sign bit of its int32
    data, gather, scatter = routing(ids.to(dev), weights.bfloat16().to(dev), E)
    order = torch.argsort(ids.flatten(), stable=True)
    assert data.expt_hist.cpu().tolist() == torch.bincount(ids.flatten(), minlength=E).tolist()
    assert gather.src_indx.cpu().tolist() == order.tolist() == scatter.dst_indx.cpu().tolist()
    assert torch.equal(data.gate_scal.cpu(), weights.bfloat16().flatten()[order])
