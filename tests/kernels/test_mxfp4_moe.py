"""MXFP4 experts: the torch reference (``quant.mxfp4``) against the tests' own quantizer, and the
fused MoE kernel (MXFP4 decoded in the GEMMs; biases; gpt-oss's clamped SwiGLU) against the torch
backend.

Without a GPU the kernels run under the Triton interpreter at small sizes in float32/float16 (the
interpreter's bf16 dot is wrong); the ``gpu`` tests run gpt-oss-20b's expert shapes in bf16.
"""

from __future__ import annotations

import pytest
import torch

from helpers import mxfp4 as ref_mx
from helpers.hopper_compile import compile_for_hopper
from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton.fused_moe import MoeConfig, fused_moe  # noqa: E402
from minisgl.kernel.triton.mxfp4 import bf16x2_pow2, decode_bf16, pair_bits  # noqa: E402
from minisgl.moe import ExpertBias, MoeActivation, Mxfp4Scales  # noqa: E402
from minisgl.moe.reference import TorchMoeBackend  # noqa: E402
from minisgl.quant.mxfp4 import dequantize_mxfp4, quantize_mxfp4  # noqa: E402

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"
GPT_OSS = MoeActivation("swiglu_clamped", alpha=1.702, limit=7.0)


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


def mx_inputs(tokens, hidden, inter, experts, top_k, dtype, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w13, s13, _ = ref_mx.quantized_experts(torch.randn(experts, 2 * inter, hidden, generator=g)
                                           / hidden**0.5)
    w2, s2, _ = ref_mx.quantized_experts(torch.randn(experts, hidden, inter, generator=g)
                                         / inter**0.5)
    logits = torch.randn(tokens, experts, generator=g)
    values, ids = torch.topk(logits, top_k, dim=-1)
    weights = values.softmax(-1)
    b = None
    if bias:
        b = ExpertBias(torch.randn(experts, 2 * inter, generator=g).to(DEV, dtype),
                       torch.randn(experts, hidden, generator=g).to(DEV, dtype) * 0.1)
    return (x.to(DEV, dtype), w13.to(DEV), w2.to(DEV), weights.to(DEV, dtype), ids.to(DEV),
            Mxfp4Scales(s13.to(DEV), s2.to(DEV)), b)


@pytest.mark.parametrize("tokens", [1, 9, 40])
@pytest.mark.parametrize("act", [GPT_OSS, MoeActivation()], ids=["swiglu_clamped", "silu"])
def test_fused_moe_mxfp4_fp32(tokens, act):
    x, w13, w2, weights, ids, scales, bias = mx_inputs(tokens, 64, 64, 6, 2, torch.float32,
                                                       seed=tokens)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=act)
    out = fused_moe(x, w13, w2, weights, ids, scales=scales, bias=bias, act=act)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", [MoeConfig(16, 32, 32, 32, 1, 4, 2),
                                    MoeConfig(32, 16, 64, 64, 2, 4, 2),
                                    MoeConfig(64, 32, 32, 64, 1, 4, 2),
                                    MoeConfig(64, 32, 64, 128, 2, 4, 2),
                                    MoeConfig(1, 16, 32, 64, 1, 4, 2)])
def test_fused_moe_mxfp4_ragged_k_and_no_down_bias(config):
    """K (hidden 96, inter 32) not a multiple of BLOCK_K 64; the down bias absent (TP rank > 0).
    Row blocks of one run the GEMV kernel, 16- and 32-row blocks the small-batch kernel, 64-row
    ones the prefill kernel (K steps of 64 and 128 values: the last step of 96 masked)."""
    x, w13, w2, weights, ids, scales, bias = mx_inputs(23, 96, 32, 5, 3, torch.float32, seed=4)
    bias = ExpertBias(bias.w13, None)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    out = fused_moe(x, w13, w2, weights, ids, config=config, scales=scales, bias=bias, act=GPT_OSS)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", [MoeConfig(16, 32, 32, 64, 1, 4, 2, swapped=True),
                                    MoeConfig(32, 16, 64, 128, 2, 4, 2, swapped=True),
                                    MoeConfig(64, 32, 64, 128, 2, 4, 2)],
                         ids=["rows16_k64", "rows32_k128", "rows64_k128"])
def test_fused_moe_mxfp4_permuted_operand_order(config):
    """The swapped kernel's tiles (16 and 32 rows where a config asks, 64 by default) in the
    permuted operand order, x's rows with them (``moe_mxfp4._operand_order``; float16: float32
    tiles cap BLOCK_K at 32, below one 64-value block). Hidden 160: GEMM 1's last K step holds
    one whole 64-value block and a masked half one (or 32 of 128 values); GEMM 2's K of 64 is
    one block."""
    x, w13, w2, weights, ids, scales, bias = mx_inputs(19, 160, 64, 5, 2, torch.float16, seed=7)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    out = fused_moe(x, w13, w2, weights, ids, config=config, scales=scales, bias=bias, act=GPT_OSS)
    torch.testing.assert_close(out, ref, rtol=5e-3, atol=5e-3)


def test_fused_moe_mxfp4_fp16():
    x, w13, w2, weights, ids, scales, bias = mx_inputs(17, 64, 32, 8, 4, torch.float16, seed=2)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    out = fused_moe(x, w13, w2, weights, ids, scales=scales, bias=bias, act=GPT_OSS)
    torch.testing.assert_close(out, ref, rtol=5e-3, atol=5e-3)


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
    e, h, inter, top_k = 32, 2880, 2880, 4
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, h, device="cuda", generator=g).bfloat16()
    w13, s13 = quantize_mxfp4(torch.randn(e, 2 * inter, h, device="cuda", generator=g) * 0.02)
    w2, s2 = quantize_mxfp4(torch.randn(e, h, inter, device="cuda", generator=g) * 0.02)
    values, ids = torch.topk(torch.randn(tokens, e, device="cuda", generator=g), top_k)
    weights = values.softmax(-1).bfloat16()
    bias = ExpertBias(torch.randn(e, 2 * inter, device="cuda", generator=g).bfloat16() * 0.1,
                      torch.randn(e, h, device="cuda", generator=g).bfloat16() * 0.1)
    scales = Mxfp4Scales(s13, s2)
    ref = TorchMoeBackend().forward(x, w13, w2, weights, ids, scales, bias=bias, act=GPT_OSS)
    out = fused_moe(x, w13, w2, weights, ids, config=config, scales=scales, bias=bias,
                    act=GPT_OSS)
    err = (out.float() - ref.float()).norm() / ref.float().norm()
    assert err <= 2e-2, err



@triton.jit
def _decode_words(words_ptr, out_ptr):
    offs = triton.language.arange(0, 16)
    words = triton.language.load(words_ptr + offs)
    for j in triton.language.static_range(4):
        lo, hi = pair_bits(words, j)
        # the GEMV takes the 2 ** 126 back through x (2 ** 100) and its sums (2 ** 26)
        triton.language.store(out_ptr + offs * 8 + j, lo * 8.507059173023462e37)
        triton.language.store(out_ptr + offs * 8 + j + 4, hi * 8.507059173023462e37)


def test_pair_bits_every_code_at_every_position():
    """``mxfp4.pair_bits`` (the GEMV's decoding of 32-bit words, two values at a time) times
    ``2 ** 126``: each of the 16 codes at each of a word's 8 positions (bits 4j .. 4j + 3),
    against the tests' own e2m1 table."""
    nibbles = (torch.arange(16)[:, None] + torch.arange(8)[None, :]) % 16  # word i, position j
    words = (nibbles << (4 * torch.arange(8))[None, :]).sum(1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    out = torch.empty(16, 8, dtype=torch.float32, device=DEV)
    _decode_words[(1,)](words.to(DEV), out)
    torch.testing.assert_close(out.cpu(), ref_mx.VALUES[nibbles], rtol=0, atol=0)


def test_the_ptx_decoding_compiles_for_hopper(tmp_path):
    """The MXFP4 GEMMs with their PTX decoding (``mxfp4.decode_bf16``, which the interpreter
    cannot run) through Triton's compiler and ptxas for sm_90: the small-batch kernel, the
    swapped one with and without its permuted operand order, the GEMV; each waiting on the
    kernel before (PDL), as the engine launches them."""
    cubins = compile_for_hopper(tmp_path, "mxfp4")
    assert [line.split()[1] for line in cubins] == [
        "moe_gemm_mx_kernel", "moe_gemm_mx_wide_kernel", "moe_gemm_mx_wide_kernel",
        "moe_gemv_mx_kernel"], cubins
    assert all(line.endswith("griddepcontrol") for line in cubins), cubins


@triton.jit
def _decode_bytes_bf16(bytes_ptr, exp_ptr, lo_ptr, hi_ptr):
    offs = triton.language.arange(0, 1024)
    lo, hi = decode_bf16(triton.language.load(bytes_ptr + offs),
                         bf16x2_pow2(triton.language.load(exp_ptr + offs)))
    triton.language.store(lo_ptr + offs, lo)
    triton.language.store(hi_ptr + offs, hi)


@pytest.mark.gpu
def test_gpu_decode_bf16_every_byte_and_multiplier():
    """``mxfp4.decode_bf16`` (the tiles' PTX decoding on Hopper): every byte, four times, each
    element with its own power-of-two multiplier (the wide tiles' scales times ``2 ** -64``, and
    ``2 ** 126``, which gives the e2m1 values themselves), exactly equal to the e2m1 table's
    values times ``2 ** -126`` times the multiplier: the sign, the subnormal 0.5, the nibbles'
    order and each element's own multiplier."""
    codes = torch.arange(1024) % 256
    exponents = torch.tensor([126, 1, 40, 60, 85, 17, 3, 33])[torch.arange(1024) % 8]
    exponents = torch.where(torch.arange(1024) >= 512, exponents.roll(1), exponents)
    lo = torch.empty(1024, dtype=torch.bfloat16, device="cuda")
    hi = torch.empty_like(lo)
    _decode_bytes_bf16[(1,)](codes.to(torch.uint8).cuda(), exponents.int().cuda(), lo, hi)
    mult = torch.pow(2.0, exponents.double() - 126)
    torch.testing.assert_close(lo.double().cpu(), ref_mx.VALUES[codes % 16].double() * mult,
                               rtol=0, atol=0)
    torch.testing.assert_close(hi.double().cpu(), ref_mx.VALUES[codes // 16].double() * mult,
                               rtol=0, atol=0)
