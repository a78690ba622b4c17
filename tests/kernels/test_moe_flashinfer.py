"""FlashInfer's CUTLASS fused MoE as the MXFP4 MoE backend (``moe/flashinfer_mxfp4.py``): the
experts' padding and order before FlashInfer interleaves them, on any machine (up rows first,
sizes padded to a multiple of 256 with zero weights and scales; the interleaving is FlashInfer's,
and the backend against the reference is ``test_moe_libraries.py``)."""

from __future__ import annotations

import pytest
import torch

from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales
from minisgl.moe.flashinfer_mxfp4 import padded_experts
from minisgl.quant.mxfp4 import quantize_mxfp4

ACT = MoeActivation("swiglu_clamped", 1.702, 7.0)


def _experts(e: int, hidden: int, inter: int):
    g = torch.Generator().manual_seed(0)
    (w13, s13), (w2, s2) = (quantize_mxfp4(torch.randn(e, rows, cols, generator=g))
                            for rows, cols in ((2 * inter, hidden), (hidden, inter)))
    bias = ExpertBias(torch.randn(e, 2 * inter, generator=g).bfloat16(),
                      torch.randn(e, hidden, generator=g).bfloat16())
    return w13, w2, Mxfp4Scales(s13, s2), bias


def test_the_layout_puts_up_rows_first_and_pads_with_zero_weights():
    e, hidden, inter = 3, 320, 96  # padded to 512 and 256
    w13, w2, scales, bias = _experts(e, hidden, inter)
    lay = padded_experts(w13, w2, scales, bias, ACT)
    hp, ip = 512, 256
    assert lay.w13.shape == (e, 2 * ip, hp // 2) and lay.w2.shape == (e, hp, ip // 2)
    assert lay.scales[0].shape == (e, 2 * ip, hp // 32)
    assert lay.scales[1].shape == (e, hp, ip // 32)
    gate, up = w13[:, :inter], w13[:, inter:]
    assert torch.equal(lay.w13[:, :inter, :hidden // 2], up)
    assert torch.equal(lay.w13[:, ip:ip + inter, :hidden // 2], gate)
    assert not lay.w13[:, inter:ip].any() and not lay.w13[:, ip + inter:].any()
    assert not lay.w13[..., hidden // 2:].any()
    assert torch.equal(lay.w2[:, :hidden, :inter // 2], w2) and not lay.w2[:, hidden:].any()
    s13, s2 = lay.scales
    assert torch.equal(s13[:, :inter, :hidden // 32], scales.w13[:, inter:])
    assert torch.equal(s13[:, ip:ip + inter, :hidden // 32], scales.w13[:, :inter])
    assert not s13[:, inter:ip].any() and not s13[..., hidden // 32:].any()
    assert torch.equal(s2[:, :hidden, :inter // 32], scales.w2) and not s2[:, hidden:].any()
    assert lay.bias13 is not None and lay.bias2 is not None
    assert torch.equal(lay.bias13[:, :inter], bias.w13[:, inter:])
    assert torch.equal(lay.bias13[:, ip:ip + inter], bias.w13[:, :inter])
    assert not lay.bias13[:, inter:ip].any() and torch.equal(lay.bias2[:, :hidden], bias.w2)
    alpha, beta, limit = lay.swiglu  # gpt-oss's (up + 1) * gate * sigmoid(alpha * gate)
    assert alpha.tolist() == pytest.approx([1.702] * e) and beta.tolist() == [1.0] * e
    assert limit.tolist() == [7.0] * e and lay.hidden == hidden
    assert lay.nbytes == sum(t.numel() * t.element_size() for t in (
        lay.w13, lay.w2, *lay.scales, lay.bias13, lay.bias2))
