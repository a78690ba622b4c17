"""FlashInfer's CUTLASS fused MoE as the MXFP4 MoE backend (``moe/flashinfer_mxfp4.py``): its
layout of the experts on any machine (up rows first, sizes padded to a multiple of 256 with zero
weights, scales four groups a row at a time), and on a Hopper GPU with FlashInfer installed the
backend against the torch reference, which dequantizes each routed expert, at gpt-oss-20b's
expert shapes (the bound and its reasons: ``test_moe_matmul_ogs.py``, the same arithmetic)."""

from __future__ import annotations

import pytest
import torch

from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales, create_moe_backend
from minisgl.moe.flashinfer_mxfp4 import FlashInferExperts, flashinfer_experts
from minisgl.moe.reference import TorchMoeBackend
from minisgl.quant.mxfp4 import quantize_mxfp4

ACT = MoeActivation("swiglu_clamped", 1.702, 7.0)


def _experts(e, hidden, inter, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device) * scale

    (w13, s13), (w2, s2) = quantize_mxfp4(randn(e, 2 * inter, hidden, scale=hidden**-0.5)), \
        quantize_mxfp4(randn(e, hidden, inter, scale=inter**-0.5))
    bias = ExpertBias(randn(e, 2 * inter, scale=0.1).bfloat16(),
                      randn(e, hidden, scale=0.1).bfloat16())
    return w13, w2, Mxfp4Scales(s13, s2), bias, randn


def _ungroup(scales: torch.Tensor, rows: int) -> torch.Tensor:
    """``[E, K/128, 4N]`` back to ``[E, N, K/32]``."""
    e = scales.shape[0]
    return scales.reshape(e, -1, rows, 4).permute(0, 2, 1, 3).reshape(e, rows, -1)


def test_the_layout_puts_up_rows_first_and_pads_with_zero_weights():
    e, hidden, inter = 3, 320, 96  # padded to 512 and 256
    w13, w2, scales, bias, _ = _experts(e, hidden, inter)
    lay = flashinfer_experts(w13, w2, scales, bias, ACT)
    hp, ip = 512, 256
    assert lay.w13.shape == (e, 2 * ip, hp // 2) and lay.w2.shape == (e, hp, ip // 2)
    assert lay.scales[0].shape == (e, hp // 128, 8 * ip)
    assert lay.scales[1].shape == (e, ip // 128, 4 * hp)
    gate, up = w13[:, :inter], w13[:, inter:]
    assert torch.equal(lay.w13[:, :inter, :hidden // 2], up)
    assert torch.equal(lay.w13[:, ip:ip + inter, :hidden // 2], gate)
    assert not lay.w13[:, inter:ip].any() and not lay.w13[:, ip + inter:].any()
    assert not lay.w13[..., hidden // 2:].any()
    assert torch.equal(lay.w2[:, :hidden, :inter // 2], w2) and not lay.w2[:, hidden:].any()
    s13 = _ungroup(lay.scales[0], 2 * ip)
    assert torch.equal(s13[:, :inter, :hidden // 32], scales.w13[:, inter:])
    assert torch.equal(s13[:, ip:ip + inter, :hidden // 32], scales.w13[:, :inter])
    assert torch.equal(_ungroup(lay.scales[1], hp)[:, :hidden, :inter // 32], scales.w2)
    assert lay.bias13 is not None and lay.bias2 is not None
    assert torch.equal(lay.bias13[:, :inter], bias.w13[:, inter:])
    assert torch.equal(lay.bias13[:, ip:ip + inter], bias.w13[:, :inter])
    assert not lay.bias13[:, inter:ip].any() and torch.equal(lay.bias2[:, :hidden], bias.w2)
    alpha, beta, limit = lay.swiglu  # gpt-oss's (up + 1) * gate * sigmoid(alpha * gate)
    assert alpha.tolist() == pytest.approx([1.702] * e) and beta.tolist() == [1.0] * e
    assert limit.tolist() == [7.0] * e and lay.hidden == hidden
    assert lay.nbytes == sum(t.numel() * t.element_size() for t in (
        lay.w13, lay.w2, *lay.scales, lay.bias13, lay.bias2))


def test_without_the_package_the_error_says_what_to_install():
    try:
        import flashinfer.fused_moe  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"minisgl\[flashinfer\]"):
            create_moe_backend("flashinfer")
    else:
        pytest.skip("flashinfer is installed")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 64, 300])
def test_matches_the_dequantized_reference(tokens):
    pytest.importorskip("flashinfer")
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FlashInfer's MXFP4 x bf16 MoE is Hopper's")
    e, k, hidden, inter = 32, 4, 2880, 2880
    w13, w2, scales, bias, randn = _experts(e, hidden, inter, "cuda", tokens)
    x = randn(tokens, hidden).bfloat16()
    weights, ids = torch.topk(randn(tokens, e).softmax(-1), k, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).bfloat16()
    backend = create_moe_backend("flashinfer")
    layout = backend.prepare_experts(w13, w2, scales, bias, ACT)
    assert isinstance(layout, FlashInferExperts)
    got = backend.forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT, layout=layout)
    want = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT)
    assert got.shape == want.shape == (tokens, hidden) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(),
                               atol=2e-2 * float(want.float().abs().max()), rtol=0)
    graph = torch.cuda.CUDAGraph()  # no host sync: a decode step captures it
    with torch.cuda.graph(graph):
        captured = backend.forward(x, w13, w2, weights, ids, scales, bias=bias, act=ACT,
                                   layout=layout)
    graph.replay()
    torch.testing.assert_close(captured, got, atol=0, rtol=0)
