"""The FP8 linear method: one function every quantized layer calls, dispatching by device and shape.

* CUDA, one token: the FP8 GEMV reads the weight as e4m3 (half the bytes of bf16) and scales it in
  registers; x stays in bf16, so a decode step loses nothing to activation rounding.
* CUDA, more tokens: x is quantized per token and ``block[1]`` columns (one Triton kernel, which also
  applies SiLU-and-mul for a gated input) and multiplied on the FP8 tensor cores by the block-scaled
  GEMM.
* CPU (and anything else): the dequantizing reference, ``x @ dequant(w)^T`` in x's dtype. It is what
  the CPU tests compare against a model of the dequantized weights, exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .fp8 import dequantize_block


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale_inv: torch.Tensor,
               block: tuple[int, int], bias: torch.Tensor | None = None,
               gated: bool = False) -> torch.Tensor:
    """``x [M, K]`` (``[M, 2K]`` = [gate | up] with ``gated``), e4m3 ``weight [N, K]`` and its block
    scales -> ``[M, N]`` in x's dtype."""
    if x.is_cuda and x.dim() == 2:
        if x.stride(1) != 1:
            x = x.contiguous()
        if x.shape[0] == 1:
            from minisgl.kernel.triton.fp8_gemv import fp8_gemv

            return fp8_gemv(x, weight, scale_inv, block, bias, gated)
        from minisgl.kernel.triton.fp8_gemm import fp8_block_gemm, quantize_act

        xq, xs = quantize_act(x, block[1], gated)
        y = fp8_block_gemm(xq, xs, weight, scale_inv, block, x.dtype)
        return y if bias is None else y + bias
    from minisgl.layers.activation import silu_and_mul

    w = dequantize_block(weight, scale_inv, block, x.dtype)
    return F.linear(silu_and_mul(x) if gated else x, w, bias)
