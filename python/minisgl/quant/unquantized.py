"""Weights in the model's dtype: ``F.linear``, or the Triton GEMV for one token on CUDA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kernel.ops import silu_and_mul

from .base import LinearMethod, MakeParam, MoEMethod, QuantizationConfig


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           gated: bool = False, gemv: bool = True, pdl: bool = False) -> torch.Tensor:
    """``F.linear``. ``gated``: x is ``[gate | up]`` and the input is ``silu(gate) * up``. One
    token in half precision on CUDA goes through the Triton GEMV (unless ``gemv`` is off), which
    streams the weight faster than cuBLAS does at that shape and applies the gate as it reads x
    (benchmark/kernels/bench_gemv.py). ``pdl``: the GEMV launches with programmatic dependent
    launch (``kernel/triton/pdl.py``)."""
    if gemv and x.is_cuda and x.dim() == 2 and x.shape[0] == 1 \
            and x.dtype in (torch.bfloat16, torch.float16) and x.stride(1) == 1:
        from minisgl.kernel.triton.gemv import gemv as triton_gemv

        return triton_gemv(x, weight, bias, gated, pdl=pdl)
    return F.linear(silu_and_mul(x) if gated else x, weight, bias)


class UnquantizedLinearMethod(LinearMethod):
    def __init__(self, gemv: bool = True) -> None:
        self.gemv = gemv

    def create_weights(self, layer: nn.Module, out: int, inp: int, make_param: MakeParam) -> None:
        layer.weight = make_param(out, inp)
        layer.weight_scale_inv = None

    def apply(self, layer, x, bias, gated=False, norm_eps=None, residual=None, act=False):
        assert norm_eps is None and residual is None and not act, \
            "a fused norm, add or activation needs a method that offers it"
        return linear(x, layer.weight, bias, gated, self.gemv, layer.pdl)


class UnquantizedMoEMethod(MoEMethod):
    """Experts in the model's dtype."""

    def create_weights(self, layer, experts, hidden, inter, make_param):
        layer.w13 = make_param("w13", experts, 2 * inter, hidden)
        layer.w2 = make_param("w2", experts, hidden, inter)
        layer.w13_scale_inv = layer.w2_scale_inv = None

    def experts(self, layer):
        return layer.w13, layer.w2, None


@dataclass(frozen=True)
class UnquantizedConfig(QuantizationConfig):
    """No quantization; carries the kernel switches."""

    name: ClassVar[str] = "none"

    def linear_method(self) -> LinearMethod:
        return UnquantizedLinearMethod(self.gemv)

    def moe_method(self) -> MoEMethod:
        return UnquantizedMoEMethod()


def linear_method(quant: QuantizationConfig | None) -> LinearMethod:
    """The dense projections' method; None: unquantized, default switches."""
    if quant is None:
        return UnquantizedLinearMethod()
    return quant.linear_method()


def moe_method(quant: QuantizationConfig | None) -> MoEMethod:
    """The MoE experts' method; None: unquantized."""
    return UnquantizedMoEMethod() if quant is None else quant.moe_method()


def unquantized_method(quant: QuantizationConfig | None) -> LinearMethod:
    """The method of layers no format quantizes (the LM head, the MoE router)."""
    return UnquantizedLinearMethod(quant.gemv if quant is not None else True)
