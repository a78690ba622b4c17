"""MXFP4 experts, gpt-oss's checkpoint format (``quant_method: mxfp4``): every MoE expert's
``gate_up_proj`` and ``down_proj`` as ``*_blocks`` (two e2m1 values a byte) and ``*_scales`` (one
e8m0 per 32 values), layout in ``quant.mxfp4``; attention, router, embedding and LM head stay in
the model's dtype (the checkpoint's ``modules_to_not_convert``).

The weights stay packed on the device (a quarter of bf16's bytes plus one byte per 32 values):
CUDA's fused MoE kernel decodes them inside the GEMM, the torch backend dequantizes each routed
expert (``moe.reference``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterator

import torch
from torch import nn

from minisgl.kernel.moe_types import Mxfp4Scales

from .base import LinearMethod, MoEMethod, QuantizationConfig
from .mxfp4 import GROUP, quantize_mxfp4

# Ampere: bf16 tensor cores, which the decoded tiles feed (no FP4 tensor-core instruction used)
_MIN_CAPABILITY = (8, 0)


class Mxfp4MoEMethod(MoEMethod):
    """``w13 [E, 2I, H/2]`` / ``w2 [E, H, I/2]`` uint8 with ``w13_scales [E, 2I, H/32]`` /
    ``w2_scales [E, H, I/32]``. Loading cuts whole 32-value groups (``unit``): each rank's share of
    the intermediate dimension must be a multiple of 32."""

    def create_weights(self, layer: nn.Module, experts: int, hidden: int, inter: int,
                       make_param) -> None:
        if hidden % GROUP:
            raise ValueError(f"hidden_size ({hidden}) must be a multiple of {GROUP} for MXFP4 "
                             "experts")
        if inter % GROUP:
            raise ValueError(f"MXFP4 experts: the intermediate size per tensor-parallel rank "
                             f"({inter}) must be a multiple of {GROUP}; use fewer ranks")
        u8 = torch.uint8
        layer.w13 = make_param("w13", experts, 2 * inter, hidden // 2, dtype=u8)
        layer.w13_scales = make_param("w13", experts, 2 * inter, hidden // GROUP, dtype=u8)
        layer.w2 = make_param("w2", experts, hidden, inter // 2, dtype=u8, unit=GROUP)
        layer.w2_scales = make_param("w2", experts, hidden, inter // GROUP, dtype=u8, unit=GROUP)
        layer.w13_scale_inv = layer.w2_scale_inv = None

    def experts(self, layer):
        return layer.w13, layer.w2, Mxfp4Scales(layer.w13_scales, layer.w2_scales)


@dataclass(frozen=True)
class Mxfp4Config(QuantizationConfig):
    """MXFP4 MoE experts; dense layers unquantized."""

    name: ClassVar[str] = "mxfp4"

    def linear_method(self) -> LinearMethod:
        from .unquantized import UnquantizedLinearMethod

        return UnquantizedLinearMethod(self.gemv)

    def moe_method(self) -> MoEMethod:
        return Mxfp4MoEMethod()

    def device_error(self, device_type: str, capability: tuple[int, int] | None) -> str | None:
        if device_type == "cpu":
            return None
        if device_type != "cuda":
            return f"MXFP4 is not supported on device type {device_type!r}"
        if capability is None or capability < _MIN_CAPABILITY:
            cap = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
            return (f"MXFP4 experts need bf16 tensor cores (compute capability 8.0 or newer); "
                    f"this GPU has {cap}")
        return None

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor
                           ) -> Iterator[tuple[str, torch.Tensor]]:
        """Stacked experts in transformers' unquantized layout (``experts.gate_up_proj
        [E, H, 2I]``, ``experts.down_proj [E, I, H]``) as gpt-oss's checkpoint holds them:
        ``*_blocks [E, N, K/32, 16]`` and ``*_scales [E, N, K/32]`` of the ``[E, N, K]``
        transpose. Other tensors pass unchanged."""
        if tensor.dim() != 3 or not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            yield name, tensor
            return
        # one expert at a time: a float copy of a whole layer's experts (8 GB for gpt-oss-120b's
        # gate_up) does not fit beside the rest of a 63 GB model on an 80 GB GPU
        parts = [quantize_mxfp4(expert.transpose(0, 1)) for expert in tensor]
        blocks, scales = (torch.stack(list(t)) for t in zip(*parts))
        yield name + "_blocks", blocks.reshape(*scales.shape, GROUP // 2)
        yield name + "_scales", scales

    def checkpoint_names(self, name: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        if len(shape) != 3 or not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            return (name,)
        return name + "_blocks", name + "_scales"
