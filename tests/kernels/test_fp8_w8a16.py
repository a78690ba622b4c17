"""The W8A16 FP8 GEMM (``kernel/triton/fp8_w8a16.py``) against the fp32 reference
``x.float() @ dequant(wq, ws)^T`` of ``minisgl.quant.fp8``, and its W8A8 form (e4m3 x with
per-token scales) against ``channel_gemm_reference`` over the same quantized operands.

Without a GPU the kernel runs under the Triton interpreter with float32 and float16 activations:
the interpreter's ``tl.dot`` multiplies bfloat16 tiles as raw integers (triton 3.9), so bfloat16
runs on the GPU only, at Qwen3-8B's sizes. ``test_fp8_kernels.py::test_kernels_compile_for_hopper``
compiles this kernel's variants for sm_90 (``hopper_compile.py``).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers.interpreter import import_triton

import_triton()
import triton  # noqa: E402

from minisgl.kernel.triton.fp8_gemm import quantize_act  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm, fp8_w8a16_gemm  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16_config import SMS, W8A16Config, pick_config  # noqa: E402
from minisgl.layers.activation import silu_and_mul_ref  # noqa: E402
from minisgl.quant.fp8 import (  # noqa: E402
    block_gemm_reference,
    channel_gemm_reference,
    dequantize_block,
    dequantize_channel,
    quantize_block,
    quantize_channel,
)

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def rand(*shape, seed=0, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(DEV, dtype)


def weights(n, k, block, seed=1):
    w = rand(n, k, seed=seed, scale=0.1)
    if block is None:
        wq, ws = quantize_channel(w)
        return wq, ws, dequantize_channel(wq, ws)
    wq, ws = quantize_block(w, block)
    return wq, ws, dequantize_block(wq, ws, block)


def reference(x, w, gated, bias=None):
    """fp32 over the kernel's inputs: the gated input is rounded to x's dtype like the kernel's."""
    y = (silu_and_mul_ref(x) if gated else x).float() @ w.T
    return y if bias is None else y + bias.float()


def check(out, ref):
    """float32: the reference's sums up to their order. float16: the output's rounding, at most
    half an ulp (2^-11 relative), and an element of ``silu(gate) * up`` F.silu may round one ulp
    away from the kernel's formula (well below 1e-4 after the dot)."""
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(out.float(), ref, rtol=2**-10, atol=1e-4)


# (block_m, block_n, block_k, split_k): one tile of 16 tokens; 32x64 tiles of 128 columns split
# in two; 256 columns, which 384 does not divide (masked K), split in three (one split, K=256).
# Two stages: float32 tiles fit in shared memory on the GPU too.
CONFIGS = [W8A16Config(16, 64, 128, num_stages=2), W8A16Config(32, 64, 128, 2, num_stages=2),
           W8A16Config(16, 32, 256, 3, num_stages=2)]


def check_configs(m, n, k, block):
    """``pick_config``'s tiles without a bias, then every one of ``CONFIGS`` with one."""
    wq, ws, w = weights(n, k, block)
    x, b = rand(m, k, seed=m), rand(n, seed=3)
    ref = reference(x, w, False)
    check(fp8_w8a16_gemm(x, wq, ws, block), ref)
    for cfg in CONFIGS:
        check(fp8_w8a16_gemm(x, wq, ws, block, b, config=cfg), ref + b)


@pytest.mark.parametrize("m", [1, 3, 16, 33])
@pytest.mark.parametrize("n, k", [(64, 256), (200, 384)])
def test_per_channel(m, n, k):
    check_configs(m, n, k, None)


@pytest.mark.parametrize("m", [3, 33])
@pytest.mark.parametrize("block", [(128, 128), (32, 128)])
@pytest.mark.parametrize("n, k", [(64, 256), (200, 384)])
def test_block_scales(m, block, n, k):
    """The tiles are capped at the scale block: one scale per program and K step."""
    check_configs(m, n, k, block)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("block", [None, (64, 128)])
def test_gated(dtype, block):
    """x = [gate | up]: the GEMM's input is silu(gate) * up, rounded as silu_and_mul rounds."""
    n, k = 200, 384
    wq, ws, w = weights(n, k, block)
    x, b = rand(33, 2 * k, seed=5, scale=2.0, dtype=dtype), rand(n, seed=3, dtype=dtype)
    ref = reference(x, w, True)
    check(fp8_w8a16_gemm(x, wq, ws, block, gated=True), ref)
    for cfg in CONFIGS[1:]:
        check(fp8_w8a16_gemm(x, wq, ws, block, b, gated=True, config=cfg), reference(x, w, True, b))


@pytest.mark.parametrize("m", [3, 16])
def test_float16_per_channel(m):
    wq, ws, w = weights(200, 384, None)
    x, b = rand(m, 384, seed=m, dtype=torch.float16), rand(200, seed=3, dtype=torch.float16)
    out = fp8_w8a16_gemm(x, wq, ws, None, b, config=CONFIGS[2])
    assert out.dtype == torch.float16 and out.shape == (m, 200)
    check(out, reference(x, w, False, b))


def test_strided_input_and_no_tokens():
    """Rows of x may be strided (a slice of a wider buffer); zero tokens give an empty output."""
    wq, ws, w = weights(64, 256, None)
    buf = rand(5, 300, seed=2)
    check(fp8_w8a16_gemm(buf[:, :256], wq, ws, None), reference(buf[:, :256], w, False))
    assert fp8_w8a16_gemm(buf[:0, :256], wq, ws, None).shape == (0, 64)


def check_a8(out, ref):
    """Interpreted: fp32 sums, the reference's up to their order. Hopper's FP8 MMA accumulates
    with fewer mantissa bits than fp32 (seen: 3e-3 absolute on outputs of a few units, K = 384)."""
    if DEV == "cpu":
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    else:
        assert rel_err(out, ref) <= 1e-2


@pytest.mark.parametrize("m", [3, 40])
@pytest.mark.parametrize("n, k", [(64, 256), (200, 384)])
def test_w8a8_per_channel(m, n, k):
    """e4m3 x e4m3 with the token's and the row's scales applied to the accumulator: the
    reference's fp32 sums up to their order, whatever the tiles and splits."""
    wq, ws, _ = weights(n, k, None)
    xq, xs = quantize_tokens(rand(m, k, seed=m), False)
    b = rand(n, seed=3)
    ref = channel_gemm_reference(xq, xs, wq, ws)
    check_a8(fp8_w8a8_gemm(xq, xs, wq, ws, out_dtype=torch.float32), ref)
    for cfg in CONFIGS:
        check_a8(fp8_w8a8_gemm(xq, xs, wq, ws, b, torch.float32, config=cfg), ref + b)
    assert fp8_w8a8_gemm(xq[:0], xs[:0], wq, ws).shape == (0, n)


@pytest.mark.parametrize("m", [3, 40])
@pytest.mark.parametrize("n, k, block", [(64, 256, (32, 64)), (200, 384, (64, 128)),
                                         (96, 352, (32, 64))])
def test_w8a8_block_scales(m, n, k, block):
    """FP8 checkpoints' format: e4m3 x with a scale per token and ``bk`` columns, block-scaled
    weights, both scales applied at every K step: the reference's fp32 sums up to their order
    (the last case: K not a multiple of the block, a partial last group and K step)."""
    wq, ws, _ = weights(n, k, block)
    xq, xs = quantize_act(rand(m, k, seed=m), block[1])
    b = rand(n, seed=3)
    ref = block_gemm_reference(xq, xs, wq, ws, block)
    check_a8(fp8_w8a8_gemm(xq, xs, wq, ws, out_dtype=torch.float32, block=block), ref)
    for cfg in CONFIGS:
        check_a8(fp8_w8a8_gemm(xq, xs, wq, ws, b, torch.float32, config=cfg, block=block), ref + b)


def test_w8a8_takes():
    """Per-channel layers of 2+ tokens: the W8A8 GEMM up to 256 tokens, but a layer of 16,384 rows
    or more (gate-up) leaves more than 192 to ``torch._scaled_mm``."""
    from minisgl.quant.fp8_dispatch import w8a8_takes

    assert w8a8_takes(256, 4096) and not w8a8_takes(257, 4096)
    assert w8a8_takes(192, 24576) and not w8a8_takes(193, 24576)


def test_pick_config():
    for m, gated, x_bytes in itertools.product((2, 16, 64, 128, 200), (False, True), (1, 2, 4)):
        for n, k in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)):
            cfg = pick_config(m, n, k, gated, x_bytes)
            assert 16 <= cfg.block_m <= 128 and k // (cfg.block_k * cfg.split_k) >= 4
            if x_bytes > 1:  # one M tile up to 128 tokens; tiles that fit 128x128 block scales
                assert cfg.block_m >= min(m, 128)
                assert 128 % cfg.block_n == 0 and 128 % cfg.block_k == 0
            else:  # W8A8 (per-channel only): M tiles cut up only while one wave holds them
                programs = triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m)
                assert cfg.block_m >= min(m, 128) or programs <= SMS
    # the rules count the device's SMs: o at 128 tokens, 64 N tiles, takes two M tiles on an
    # H100 (128 programs) and one on a GPU of half as many SMs
    assert pick_config(128, 4096, 4096, x_bytes=1).block_m == 64
    assert pick_config(128, 4096, 4096, x_bytes=1, sms=SMS // 2).block_m == 128
    assert pick_config(16, 4096, 4096).split_k > pick_config(16, 4096, 4096, sms=16).split_k


# ---------------------------------------------------------------- GPU, Qwen3-8B's sizes, bf16


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


LAYERS = [(6144, 4096, False), (4096, 4096, False), (24576, 4096, False), (4096, 12288, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("block", [None, (128, 128)])
@pytest.mark.parametrize("m", [2, 16, 64, 128, 200])
@pytest.mark.parametrize("n, k, gated", LAYERS)
def test_gpu_qwen3_8b_layers(n, k, gated, m, block):
    """bf16 activations against fp32 over the same operands: <= 1e-2 relative (the bf16 output
    alone rounds by up to 2^-9)."""
    x = torch.randn(m, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda") * 0.02
    wq, ws = quantize_channel(w) if block is None else quantize_block(w, block)
    wd = dequantize_channel(wq, ws) if block is None else dequantize_block(wq, ws, block)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = reference(x, wd, gated, b)
    assert rel_err(fp8_w8a16_gemm(x, wq, ws, block, b, gated), ref) <= 1e-2
    for split in (1, 4):
        cfg = W8A16Config(min(128, max(16, 1 << (m - 1).bit_length())), 128, 128, split, 8, 3)
        assert rel_err(fp8_w8a16_gemm(x, wq, ws, block, b, gated, cfg), ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 16, 33, 64, 128, 256])
@pytest.mark.parametrize("n, k, gated", LAYERS)
def test_gpu_w8a8_qwen3_8b_layers(n, k, gated, m):
    """Per-token e4m3 x (SiLU-and-mul applied by the quantization kernel) on the FP8 tensor cores,
    with the default tiles and with 1 and 4 splits, against fp32 over the same quantized operands,
    bf16 out: <= 1e-2 relative, 1.5e-2 over the down projection's 12,288 (Hopper's FP8 MMA
    accumulates with fewer bits than fp32, fast over all of K: ``fp8_w8a16``'s NOTE)."""
    tol = 1e-2 if k <= 4096 else 1.5e-2
    x = torch.randn(m, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
    wq, ws = quantize_channel(torch.randn(n, k, device="cuda") * 0.02)
    xq, xs = quantize_tokens(x, gated)
    ref = channel_gemm_reference(xq, xs, wq, ws)
    assert rel_err(fp8_w8a8_gemm(xq, xs, wq, ws), ref) <= tol
    for split in (1, 4):
        cfg = W8A16Config(min(128, max(16, 1 << (m - 1).bit_length())), 64, 128, split, 4, 4)
        assert rel_err(fp8_w8a8_gemm(xq, xs, wq, ws, config=cfg), ref) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("m", [2, 33, 64, 128, 256])
@pytest.mark.parametrize("n, k, gated", LAYERS)
def test_gpu_w8a8_block_qwen3_8b_layers(n, k, gated, m):
    """128x128 block weights and x quantized per token and 128 columns (SiLU-and-mul applied by the
    quantization kernel), with the default tiles and 1 and 4 splits, against fp32 over the same
    operands, bf16 out: <= 1e-2 relative (each K step's sum is scaled into fp32)."""
    x = torch.randn(m, 2 * k if gated else k, device="cuda", dtype=torch.bfloat16)
    wq, ws = quantize_block(torch.randn(n, k, device="cuda") * 0.02, (128, 128))
    xq, xs = quantize_act(x, 128, gated)
    ref = block_gemm_reference(xq, xs, wq, ws, (128, 128))
    assert rel_err(fp8_w8a8_gemm(xq, xs, wq, ws, block=(128, 128)), ref) <= 1e-2
    for split in (1, 4):
        cfg = W8A16Config(min(128, max(16, 1 << (m - 1).bit_length())), 64, 128, split, 4, 4)
        assert rel_err(fp8_w8a8_gemm(xq, xs, wq, ws, config=cfg, block=(128, 128)), ref) <= 1e-2


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    """Captured once (split-K: its partials come from the graph's pool), replayed on new x."""
    wq, ws = quantize_channel(torch.randn(4096, 4096, device="cuda") * 0.02)
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    cfg = W8A16Config(16, 64, 128, 4)
    fp8_w8a16_gemm(x, wq, ws, None, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fp8_w8a16_gemm(x, wq, ws, None, config=cfg)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert rel_err(y, x.float() @ dequantize_channel(wq, ws).T) <= 1e-2
