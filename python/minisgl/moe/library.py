"""What the MXFP4 MoE backends of outside libraries share (``matmul_ogs.py``: OpenAI's
triton_kernels; ``flashinfer_mxfp4.py``: FlashInfer's CUTLASS fused MoE). Each takes gpt-oss-style
experts (MXFP4 with the clamped SwiGLU, on a CUDA GPU of the generations its layouts are made for)
into a layout of its own once after loading (``convert``) and runs them from it (``run``: bf16
activations, a non-empty batch); every other layer, and a batch of such a layer run without the
layout, takes the fused Triton MoE (``moe.fused``).
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from .base import SILU, BaseMoeBackend, ExpertBias, ExpertLayout, MoeActivation, Mxfp4Scales
from .fused import TritonMoeBackend


class LibraryMoeBackend(BaseMoeBackend):
    name: str  # the registry's, for errors
    capabilities: tuple[tuple[int, int], tuple[int, int]]  # the first and past-last it supports
    layout_type: type  # what ``convert`` returns

    def __init__(self) -> None:
        self.fused = TritonMoeBackend()

    @abstractmethod
    def convert(self, w13: torch.Tensor, w2: torch.Tensor, scales: Mxfp4Scales,
                bias: ExpertBias | None, act: MoeActivation) -> ExpertLayout:
        """The library's layout of a layer's packed MXFP4 experts (``forward``'s arguments)."""

    @abstractmethod
    def run(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
            layout) -> torch.Tensor:
        """The experts of ``x`` (bf16 ``[T, H]``, T > 0) from ``layout``."""

    def prepare_experts(self, w13, w2, scales, bias: ExpertBias | None,
                        act: MoeActivation) -> ExpertLayout | None:
        first, end = self.capabilities
        if not (isinstance(scales, Mxfp4Scales) and w13.is_cuda and act.kind == "swiglu_clamped"
                and first <= torch.cuda.get_device_capability(w13.device) < end):
            return self.fused.prepare_experts(w13, w2, scales, bias, act)
        return self.convert(w13, w2, scales, bias, act)

    def forward(self, x, w13, w2, topk_weights, topk_ids, scales=None, *, bias=None, act=SILU,
                pdl=False, layout=None) -> torch.Tensor:
        if not isinstance(layout, self.layout_type):
            return self.fused.forward(x, w13, w2, topk_weights, topk_ids, scales, bias=bias,
                                      act=act, pdl=pdl, layout=layout)
        if x.dtype != torch.bfloat16:
            raise ValueError(f"MoE backend {self.name}: bf16 activations, got {x.dtype}")
        if x.shape[0] == 0:
            return torch.zeros_like(x)
        return self.run(x.contiguous(), topk_weights, topk_ids, layout)
