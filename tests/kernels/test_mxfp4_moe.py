"""MXFP4 experts: the torch reference (``quant.mxfp4``) against the tests' own quantizer, and the
fused MoE kernel (MXFP4 decoded in the GEMMs, from the word layout the Triton backend converts the
experts to; biases; gpt-oss's clamped SwiGLU) against the torch backend, which reads the
checkpoint's bytes.

Without a GPU the kernels run under the Triton interpreter at small sizes in float32/float16 (the
interpreter's bf16 dot is wrong); the ``gpu`` tests run gpt-oss-20b's expert shapes in bf16.
"""

from __future__ import annotations

import pytest
import torch

from helpers import mxfp4 as ref_mx
from helpers.hopper_compile import compile_for_hopper
from helpers.interpreter import import_triton
from helpers.mxfp4 import DEV, GPT_OSS, gpt_oss_20b_case, mx_inputs

triton = import_triton()

from minisgl.kernel.triton.fused_moe import MoeConfig, fused_moe  # noqa: E402
from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales  # noqa: E402
from minisgl.moe.fused import TritonMoeBackend  # noqa: E402
from minisgl.moe.reference import TorchMoeBackend  # noqa: E402
from minisgl.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4, to_words  # noqa: E402

pytestmark = pytest.mark.any_device


def test_dequantize_matches_the_tests_quantizer():
    w = torch.randn(3, 40, 96, generator=torch.Generator().manual_seed(0)) * 0.05
    blocks, scales = ref_mx.quantize(w)
    expected = ref_mx.dequantize(blocks, scales)
    got = dequantize_mxfp4(blocks.flatten(-2), scales, torch.float32)
    assert torch.equal(got, expected)
    # every code of the table, every nibble position
    codes = torch.arange(256, dtype=torch.uint8).reshape(8, 32)
    s = torch.full((8, 2), 127, dtype=torch.uint8)
    assert torch.equal(dequantize_mxfp4(codes, s), ref_mx.dequantize(codes.view(8, 2, 16), s))


def test_quantize_round_trip():
    """The package's quantizer (random MXFP4 weights): within half a step of the e2m1 grid, and a
    fixed point on values already on the grid."""
    w = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    blocks, scales = quantize_mxfp4(w)
    back = dequantize_mxfp4(blocks, scales)
    step = torch.exp2(scales.float() - 127).repeat_interleave(32, -1)  # grid gap <= 2 * step
    assert (back - w).abs().le(2 * step).all()
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(back)), back)  # (up to the sign of 0)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.zeros(2, 48))


@pytest.mark.parametrize("tokens", [1, 9, 40])
@pytest.mark.parametrize("act", [GPT_OSS, MoeActivation()], ids=["swiglu_clamped", "silu"])
def test_fused_moe_mxfp4_fp32(tokens, act):
    x, w13, w2, weights, ids, scales, bias = mx_inputs(tokens, 64, 64, 6, 2, torch.float32,
                                                       seed=tokens)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=act)
    out = fused_moe(x, to_words(w13), to_words(w2), weights, ids, scales=scales, bias=bias,
                    act=act)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", [MoeConfig(16, 32, 32, 32, 1, 4, 2),
                                    MoeConfig(32, 16, 64, 64, 2, 4, 2),
                                    MoeConfig(64, 32, 32, 64, 1, 4, 2),
                                    MoeConfig(64, 32, 64, 128, 2, 4, 2),
                                    MoeConfig(1, 16, 32, 64, 1, 4, 2),
                                    MoeConfig(1, 16, 16, 32, 1, 4, 2)])
def test_fused_moe_mxfp4_ragged_k_and_no_down_bias(config):
    """K (hidden 96, inter 32) not a multiple of BLOCK_K 64; the down bias absent (TP rank > 0).
    Row blocks of one run the GEMV kernel (K steps of 64, the last masked, and of 32, none),
    16- and 32-row blocks the small-batch kernel, 64-row ones the prefill kernel (K steps of 64
    and 128 values: the last step of 96 masked). The GEMV runs 7 tokens (its programs, one a
    routed pair and column block, are slow under the interpreter), the tiles 23."""
    tokens = 7 if config.block_m == 1 else 23
    x, w13, w2, weights, ids, scales, bias = mx_inputs(tokens, 96, 32, 5, 3, torch.float32,
                                                       seed=4)
    bias = ExpertBias(bias.w13, None)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    out = fused_moe(x, to_words(w13), to_words(w2), weights, ids, config=config, scales=scales,
                    bias=bias, act=GPT_OSS)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", [MoeConfig(16, 32, 32, 64, 1, 4, 2, swapped=True),
                                    MoeConfig(32, 16, 64, 128, 2, 4, 2, swapped=True),
                                    MoeConfig(32, 16, 64, 128, 2, 4, 2, swapped=True, maxnreg=64),
                                    MoeConfig(64, 32, 64, 128, 2, 4, 2)],
                         ids=["rows16_k64", "rows32_k128", "rows32_k128_maxnreg64", "rows64_k128"])
def test_fused_moe_mxfp4_permuted_operand_order(config):
    """The swapped kernel's tiles (16 and 32 rows where a config asks, 64 by default) in the
    permuted operand order, x's rows with them (``moe_mxfp4._operand_order``; float16: float32
    tiles cap BLOCK_K at 32, below one 64-value block; one capped at 64 registers a thread).
    Hidden 160: GEMM 1's last K step holds one whole 64-value block and a masked half one (or 32
    of 128 values); GEMM 2's K of 64 is one block."""
    x, w13, w2, weights, ids, scales, bias = mx_inputs(19, 160, 64, 5, 2, torch.float16, seed=7)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    out = fused_moe(x, to_words(w13), to_words(w2), weights, ids, config=config, scales=scales,
                    bias=bias, act=GPT_OSS)
    torch.testing.assert_close(out, ref, rtol=5e-3, atol=5e-3)


def test_fused_moe_mxfp4_fp16():
    x, w13, w2, weights, ids, scales, bias = mx_inputs(17, 64, 32, 8, 4, torch.float16, seed=2)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    out = fused_moe(x, to_words(w13), to_words(w2), weights, ids, scales=scales, bias=bias,
                    act=GPT_OSS)
    torch.testing.assert_close(out, ref, rtol=5e-3, atol=5e-3)


def test_the_triton_backend_runs_mxfp4_experts_from_its_word_layout():
    """``prepare_experts`` converts a layer's MXFP4 experts to the word layout and holds them
    with their scales and biases (the layer then empties its own); MXFP4 without the layout is
    refused rather than misread; other storages keep no layout."""
    x, w13, w2, weights, ids, scales, bias = mx_inputs(7, 64, 32, 4, 2, torch.float32, seed=8)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    backend = TritonMoeBackend()
    layout = backend.prepare_experts(w13, w2, scales, bias, GPT_OSS)
    assert torch.equal(layout.w13, to_words(w13)) and torch.equal(layout.w2, to_words(w2))
    held = (w13, w2, *scales, *bias)
    assert layout.nbytes == sum(t.numel() * t.element_size() for t in held)
    with pytest.raises(ValueError, match="layout"):
        backend.forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    empty = w13.new_empty(0)
    out = backend.forward(x, empty, empty, weights, ids, Mxfp4Scales(empty, empty), act=GPT_OSS,
                          layout=layout)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert backend.prepare_experts(x.new_zeros(4, 8, 8), x.new_zeros(4, 8, 4), None, None,
                                   GPT_OSS) is None


def test_fused_moe_dense_bias_and_clamped_swiglu():
    """The unquantized path with gpt-oss's biases and activation (a bf16 gpt-oss checkpoint)."""
    x, _, _, weights, ids, _, bias = mx_inputs(13, 64, 32, 6, 2, torch.float32, seed=5)
    g = torch.Generator().manual_seed(6)
    w13 = (torch.randn(6, 64, 64, generator=g) / 8).to(DEV)
    w2 = (torch.randn(6, 64, 32, generator=g) / 6).to(DEV)
    x = x * 4  # into the clamp
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, bias=bias, act=GPT_OSS)
    out = fused_moe(x, w13, w2, weights, ids, bias=bias, act=GPT_OSS)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, MoeConfig(1, 16, 16, 256, 1, 4, 3),
                                    MoeConfig(16, 128, 128, 64, 1, 4, 4, swapped=True)],
                         ids=["picked", "gemv", "swapped16"])
@pytest.mark.parametrize("tokens", [1, 64, 256, 700])
def test_gpu_fused_moe_mxfp4_gpt_oss_20b_shapes(tokens, config):
    """gpt-oss-20b's experts (32 x 2880 x 2880, top 4) in bf16 against the dequantizing
    reference: within bf16's rounding of two GEMMs; the tiles ``pick_config`` picks, the GEMV
    kernel's, and 16-row blocks on the swapped kernel (its permuted operand order, decoded in
    PTX on Hopper)."""
    x, w13, w2, weights, ids, scales, bias = gpt_oss_20b_case(tokens)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    out = fused_moe(x, to_words(w13), to_words(w2), weights, ids, config=config, scales=scales,
                    bias=bias, act=GPT_OSS)
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err <= 2e-2, err


def test_the_ptx_decoding_compiles_for_hopper(tmp_path):
    """The MXFP4 GEMMs with their PTX decoding (``mxfp4.decode_words_bf16``, which the interpreter
    cannot run) through Triton's compiler and ptxas for sm_90: the small-batch kernel, the
    swapped one with and without its permuted operand order, the GEMV, the fragment layout's
    GEMM and GEMV (two and one warps); each waiting on the kernel before (PDL), as the engine
    launches them. The fragment GEMV's K loop converts no layout: x loads straight into the
    registers its words' lanes use, no round trip through shared memory behind CTA barriers."""
    cubins = compile_for_hopper(tmp_path, "mxfp4")
    assert [line.split()[1] for line in cubins] == [
        "moe_gemm_mx_kernel", "moe_gemm_mx_wide_kernel", "moe_gemm_mx_wide_kernel",
        "moe_gemv_mx_kernel", "moe_gemm_mx_frag_kernel", "moe_gemv_mx_frag_kernel",
        "moe_gemv_mx_frag_kernel"], cubins
    assert all(line.endswith("griddepcontrol") for line in cubins), cubins
    assert all("loop-conversions=0" in line for line in cubins[-2:]), cubins[-2:]
