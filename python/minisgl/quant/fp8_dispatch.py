"""The FP8 kernel decision table: the one function both FP8 linear methods (``fp8_channel``,
``fp8_block``) call, dispatching by device, shape and scale layout. Every threshold lives here.

Block scales (``block = (bn, bk)``: FP8 checkpoints, and ``--quantization fp8-block``):

* CUDA, one token: the FP8 GEMV reads the weight as e4m3 (half the bytes of bf16) and scales it in
  registers; x stays in bf16, so a decode step loses nothing to activation rounding.
* CUDA, 2 to ``W8A16_MAX_TOKENS`` tokens (batched decode, bound by the weight's bytes): the W8A16
  GEMM converts the e4m3 weight tile in registers and multiplies on the bf16 tensor cores; x stays
  in bf16 and no kernel quantizes it.
* CUDA, more tokens: x is quantized per token and ``block[1]`` columns (one Triton kernel, which
  also applies SiLU-and-mul for a gated input), then multiplied on the FP8 tensor cores: up to
  ``BLOCK_W8A8_MAX_TOKENS`` by the W8A8 GEMM with block scales, beyond by cuBLAS's block-scaled
  GEMM (``torch._scaled_mm``, CUDA 12.9+ on sm_90; elsewhere the W8A8 GEMM up to
  ``W8A8_MAX_TOKENS``, then the Triton block GEMM).

Per-channel scales (``block=None``, ``scale [N, 1]``: ``--quantization fp8`` by default):

* CUDA, one token: the same GEMV, the row's scale applied once to its dot product; given
  ``norm_eps`` it also RMS-normalises x (the norm's weight folded into the layer) and given
  ``residual`` it adds it to the output (``LlamaDecoderLayer._forward_one_token``).
* CUDA, more tokens, a bf16 layer that meets ``scaled_mm_ok``: x is quantized per token (one
  Triton kernel, SiLU-and-mul included; or the RMSNorm before the layer did it, a
  ``QuantizedInput``); up to ``W8A8_MAX_TOKENS`` (``w8a8_takes``) the W8A16 GEMM's W8A8 form
  multiplies on the FP8 tensor cores (x rounded to e4m3, as vLLM's and SGLang's FP8 layers round
  it), beyond it ``torch._scaled_mm`` with row-wise scales (cuBLASLt's FP8 GEMM, bf16 out).
* CUDA, another layer (fp16, odd sizes): the W8A16 GEMM up to ``W8A16_MAX_TOKENS`` tokens, the
  row's scale applied once; beyond, the dequantizing path below.

CPU (and anything else): the dequantizing reference, ``x @ dequant(w)^T`` in x's dtype. It is what
the CPU tests compare against a model of the dequantized weights, exactly.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from minisgl.kernel.ops import rms_norm, silu_and_mul

from .base import QuantizedInput
from .fp8 import dequantize_block, dequantize_channel

# The thresholds below are where one kernel stops beating the next on Qwen3-8B's layers (H100,
# ``bench_fp8_small.py``; the figures in docs/performance.md, "Measurements behind the code").
# the most tokens the W8A16 GEMM takes (beyond, quantizing x and ``torch._scaled_mm`` win; the
# W8A8 form beats both for per-channel bf16 layers)
W8A16_MAX_TOKENS = 32
# the most tokens the W8A8 form takes (beyond, ``torch._scaled_mm``)
W8A8_MAX_TOKENS = 256
# ... except a layer of this many rows or more beyond WIDE_W8A8_MAX_TOKENS: cuBLASLt's tiles fill
# the SMs there
WIDE_ROWS = 16384
WIDE_W8A8_MAX_TOKENS = 192


# block-scaled layers (FP8 checkpoints), bf16, 33 to this many tokens: x quantized per token and
# 128 columns + the W8A8 GEMM with block scales; more: cuBLAS's block-scaled GEMM
# (``torch._scaled_mm``, CUDA 12.9+ on sm_90), which overtakes it between 64 and 128 tokens; up to
# 32 the W8A16 GEMM ties the W8A8 one without rounding x
BLOCK_W8A8_MAX_TOKENS = 96


def w8a8_takes(m: int, n: int) -> bool:
    """Whether ``m`` tokens through a layer of ``n`` rows take the W8A8 GEMM (else
    ``torch._scaled_mm``)."""
    return m <= (WIDE_W8A8_MAX_TOKENS if n >= WIDE_ROWS else W8A8_MAX_TOKENS)


def scaled_mm_ok(dtype: torch.dtype, weight: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether ``torch._scaled_mm`` with row-wise scales takes this layer: K and N multiples of 16
    (cuBLASLt's FP8 alignment), the weight contiguous ``[N, K]`` (so ``weight.t()`` is the
    column-major second operand it requires), contiguous fp32 scales, and a bf16 output (the output
    type row-wise scaling is documented for; fp16 models take the dequantizing fallback)."""
    n, k = weight.shape
    return (k % 16 == 0 and n % 16 == 0 and weight.is_contiguous() and scale.is_contiguous()
            and scale.dtype == torch.float32 and dtype == torch.bfloat16)


def takes_quantized_input(weight: torch.Tensor, scale: torch.Tensor | None,
                          block: tuple[int, int] | None, dtype: torch.dtype) -> bool:
    """Whether a layer on CUDA quantizes its input per token for every batch of 2 or more tokens
    (per-channel e4m3 weight, ``scaled_mm_ok``), so a ``QuantizedInput`` may replace x."""
    return (weight.dtype == torch.float8_e4m3fn and scale is not None and block is None
            and scaled_mm_ok(dtype, weight, scale))


def _channel_gemm(x: torch.Tensor | QuantizedInput, weight: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor | None, gated: bool, pdl: bool) -> torch.Tensor:
    if isinstance(x, QuantizedInput):
        xq, xs = x.q, x.scale
    else:
        from minisgl.kernel.triton.fp8_quant import quantize_tokens

        xq, xs = quantize_tokens(x, gated, pdl=pdl)
    if w8a8_takes(xq.shape[0], weight.shape[0]):
        from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm

        return fp8_w8a8_gemm(xq, xs, weight, scale, bias, x.dtype, pdl=pdl)
    # scale_a [M, 1] per token, scale_b [1, N] per output channel; the bias is added afterwards
    # (its dtype must equal out_dtype inside _scaled_mm; a separate add keeps that rule out of
    # reach).
    # Fast accumulation, as the W8A8 GEMM (``fp8_w8a16``'s NOTE): 6-12% faster on Qwen3-8B's
    # layers at 2,048-8,192 tokens, within 1.2e-2 of fp32 (H100)
    y = torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=scale.view(1, -1),
                         out_dtype=x.dtype, use_fast_accum=True)
    return y if bias is None else y + bias


@functools.cache
def _cublas_block_scaling(device: int) -> bool:
    """cuBLAS's FP8 GEMM with 1x128 (x) and 128x128 (weight) block scales: CUDA 12.9+ on sm_90."""
    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    return cuda >= (12, 9) and torch.cuda.get_device_capability(device) == (9, 0)


def blockwise_scaled_mm_ok(x: torch.Tensor, weight: torch.Tensor, block: tuple[int, int]) -> bool:
    """Whether ``torch._scaled_mm`` with block-wise scales takes this layer: 128x128 blocks, N and K
    multiples of 128, a bf16 output, cuBLAS's block scaling on this GPU."""
    n, k = weight.shape
    return (tuple(block) == (128, 128) and n % 128 == 0 and k % 128 == 0
            and x.dtype == torch.bfloat16 and _cublas_block_scaling(x.device.index or 0))


def _block_gemm(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                block: tuple[int, int], bias: torch.Tensor | None, gated: bool,
                pdl: bool) -> torch.Tensor:
    """More than ``W8A16_MAX_TOKENS`` tokens through a block-scaled layer on CUDA: x quantized per
    token and ``block[1]`` columns, then the W8A8 GEMM with block scales (swap AB: the weight's
    rows fill the MMA, the tokens may be few) up to ``BLOCK_W8A8_MAX_TOKENS``, beyond cuBLAS's
    block-scaled GEMM where ``blockwise_scaled_mm_ok``; else the W8A8 GEMM up to
    ``W8A8_MAX_TOKENS`` and the Triton block GEMM beyond."""
    from minisgl.kernel.triton.fp8_gemm import fp8_block_gemm, quantize_act

    m = x.shape[0]
    if m > BLOCK_W8A8_MAX_TOKENS and blockwise_scaled_mm_ok(x, weight, block):
        # cuBLAS takes a multiple of 4 tokens: a shorter batch gets zero rows, their outputs dropped
        xq, xs = quantize_act(x, 128, gated, column_major=True, rows=-(-m // 4) * 4)
        y = torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=scale_inv.t(),
                             out_dtype=x.dtype)[:m]
        return y if bias is None else y + bias
    xq, xs = quantize_act(x, block[1], gated)
    if m <= W8A8_MAX_TOKENS and block[0] >= 16 and block[1] >= 32:
        from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm

        return fp8_w8a8_gemm(xq, xs, weight, scale_inv, bias, x.dtype, block=block, pdl=pdl)
    y = fp8_block_gemm(xq, xs, weight, scale_inv, block, x.dtype)
    return y if bias is None else y + bias


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
               block: tuple[int, int] | None, bias: torch.Tensor | None = None,
               gated: bool = False, norm_eps: float | None = None,
               residual: torch.Tensor | None = None, act: bool = False,
               pdl: bool = False) -> torch.Tensor:
    """``x [M, K]`` (``[M, 2K]`` = [gate | up] with ``gated``), e4m3 ``weight [N, K]`` and its
    scales (block scales, or per-channel ``[N, 1]`` with ``block=None``) -> ``[M, N]`` in x's
    dtype.

    ``norm_eps``: the input is ``x`` RMS-normalised without a weight (``layers.fusion.fuse_norms``
    multiplied it into ``weight``); ``residual [M, N]`` is added to the output. One token on CUDA
    does both inside the FP8 GEMV (no norm kernel, no add); elsewhere they are the torch ops.
    ``act``: the layer is gate-up and the output is ``silu(gate) * up [M, N/2]``: one token on CUDA
    with per-channel scales, in the GEMV's epilogue (the down GEMV then reads half the input and
    computes no SiLU); elsewhere ``silu_and_mul`` after the GEMM.
    ``x`` may be a ``QuantizedInput`` (CUDA, 2 or more tokens, ``takes_quantized_input``).
    ``pdl``: the Triton kernels launch with programmatic dependent launch
    (``kernel/triton/pdl.py``)."""
    if isinstance(x, QuantizedInput):
        assert block is None and not gated and norm_eps is None and residual is None and not act
        return _channel_gemm(x, weight, scale_inv, bias, False, pdl)
    if x.is_cuda and x.dim() == 2 and x.shape[0] == 1 and (block is None or not act):
        from minisgl.kernel.triton.fp8_gemv import fp8_gemv

        return fp8_gemv(x.contiguous(), weight, scale_inv, block, bias, gated,
                        norm_eps=norm_eps, residual=residual, act=act, pdl=pdl)
    if norm_eps is not None:
        x = rms_norm(x, torch.ones((), dtype=x.dtype, device=x.device), norm_eps)
    y = _fp8_linear(x, weight, scale_inv, block, bias, gated, pdl)
    if act:
        y = silu_and_mul(y)
    return y if residual is None else y + residual


def _fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
                block: tuple[int, int] | None, bias: torch.Tensor | None,
                gated: bool, pdl: bool) -> torch.Tensor:
    if x.is_cuda and x.dim() == 2:
        if x.stride(1) != 1:
            x = x.contiguous()
        if block is None and scaled_mm_ok(x.dtype, weight, scale_inv):
            return _channel_gemm(x, weight, scale_inv, bias, gated, pdl)
        if x.shape[0] <= W8A16_MAX_TOKENS:
            from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a16_gemm

            return fp8_w8a16_gemm(x, weight, scale_inv, block, bias, gated)
        if block is not None:
            return _block_gemm(x, weight, scale_inv, block, bias, gated, pdl)
    if block is None:
        w = dequantize_channel(weight, scale_inv, x.dtype)
    else:
        w = dequantize_block(weight, scale_inv, block, x.dtype)
    return F.linear(silu_and_mul(x) if gated else x, w, bias)
