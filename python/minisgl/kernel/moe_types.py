"""The value types the MoE kernels and backends take: how GEMM 1's halves combine
(``MoeActivation``), per-expert biases (``ExpertBias``) and the scales of quantized experts
(``FP8Scales``, ``Mxfp4Scales``; layouts in ``minisgl.quant.fp8`` and ``minisgl.quant.mxfp4``).

A leaf module (torch only): the kernels (``kernel/triton/fused_moe.py``), the quantization methods
that hand over the experts' storage (``minisgl.quant``), the backends (``minisgl.moe``) and the
layers all read these, so none imports another for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

FP8Scales = tuple[torch.Tensor, torch.Tensor, tuple[int, int]]

ACTIVATIONS = ("silu", "swiglu_clamped", "gelu_tanh")


class Mxfp4Scales(NamedTuple):
    """The e8m0 scales (uint8, value ``2 ** (s - 127)``) of packed e2m1 experts, one per 32
    values along each row's K: ``w13 [E, 2I, H/32]``, ``w2 [E, H, I/32]``. The packed values
    are the checkpoint's bytes (``minisgl.quant.mxfp4``), or, for the fused Triton MoE
    (``kernel.triton.fused_moe``), the same bytes in the word layout (``to_words``)."""

    w13: torch.Tensor
    w2: torch.Tensor


class FragmentScales(Mxfp4Scales):
    """``Mxfp4Scales`` of experts in the fragment layout (``quant.mxfp4_fragments``), scales in
    that layout's order too: the fused Triton MoE runs its fragment GEMM on them."""


class GluonFragmentScales(FragmentScales):
    """``FragmentScales`` whose tiles marked ``gluon`` (``moe_mxfp4_frag.GLUON_TILES``) take the
    Gluon kernel (``kernel.triton.moe_mxfp4_gluon``; bf16 on Hopper, gpt-oss's SwiGLU), the rest
    as there."""


class ExpertBias(NamedTuple):
    """Per-expert biases (gpt-oss): ``w13 [E, 2I]`` (gate, then up) added to GEMM 1 before the
    activation, ``w2 [E, H]`` added to GEMM 2 before the routing weight; either may be None
    (a tensor-parallel rank other than 0 passes no ``w2``, so the all-reduce counts it once)."""

    w13: torch.Tensor | None
    w2: torch.Tensor | None


@dataclass(frozen=True)
class MoeActivation:
    """How GEMM 1's gate and up halves combine into the input of GEMM 2.

    ``silu``: ``silu(gate) * up`` (Llama, Qwen). ``swiglu_clamped`` (gpt-oss): the gate is
    clamped from above and the up half on both sides at ``limit``, then
    ``(up + 1) * gate * sigmoid(alpha * gate)``; the clamp keeps the product of two unbounded
    halves from overflowing bf16. ``gelu_tanh`` (Gemma 4): ``gelu(gate, approximate="tanh") *
    up``."""

    kind: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self) -> None:
        if self.kind not in ACTIVATIONS:
            raise ValueError(f"MoE activation {self.kind!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.kind == "swiglu_clamped" and not self.limit > 0:
            raise ValueError(f"swiglu_limit: must be positive, got {self.limit}")

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """``h [..., 2I]`` = [gate | up] -> ``[..., I]`` (the torch reference)."""
        gate, up = h.chunk(2, dim=-1)
        if self.kind == "silu":
            return F.silu(gate) * up
        if self.kind == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


SILU = MoeActivation()

# (w13, w2, scales): a layer's stacked experts as its MoE method stores them
Experts = tuple[torch.Tensor, torch.Tensor, FP8Scales | Mxfp4Scales | None]
