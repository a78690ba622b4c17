"""MXFP4 experts through FlashInfer's CUTLASS fused MoE on Hopper: mixed-input grouped GEMMs that
read e2m1 weights with e8m0 scales and bf16 activations, the clamped SwiGLU in the first GEMM's
epilogue (``--moe-backend flashinfer``; ``pip install 'minisgl[flashinfer]'``). vLLM's other
Hopper path for gpt-oss, beside ``triton_kernels``.

Its kernels want sizes that whole 64-row and 128-deep scale blocks cover: ``padded_experts``
pads the hidden and intermediate sizes to ``PAD`` with zero weights and biases (3,072 for
gpt-oss's 2,880: 7% more bytes to read) and puts each expert's up rows before its gate rows (the
kernel's order); FlashInfer's own helpers then interleave the packed weights (the order its
lookup-table decode reads them in) and fold the scales into its 64 x 128 blocks
(``interleave_moe_{weights,scales}_for_sm90_mixed_gemm``), and the layer's own copy is released.
Every forward pads x and slices the output. The top-k sum is the deterministic one (the fused
epilogue's atomics are not: greedy decoding must not depend on the run). The kernel's tactic
per token bucket is chosen by FlashInfer's autotuner on the first eager call of that bucket
(never while a graph captures: it times launches). Other experts (bf16, FP8, other activations,
other GPUs) take the fused Triton MoE (``moe.fused``).

The module is FlashInfer's ``fused_moe_90``, compiled on first use (its JIT cache keeps it):
FlashInfer 0.6.18 builds it from about 250 CUTLASS units, every type pair's grouped GEMMs (219
generated, 23 of them bf16 x MXFP4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import ExpertBias, MoeActivation, Mxfp4Scales
from .library import LibraryMoeBackend

_HOPPER, _NEXT = (9, 0), (10, 0)
PAD = 256  # hidden and intermediate sizes padded to a multiple of this


def _round_up(n: int) -> int:
    return -(-n // PAD) * PAD


def _pad(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``t`` zero-padded along ``dim`` to ``size``."""
    return F.pad(t, [0, 0] * (t.dim() - 1 - dim) + [0, size - t.shape[dim]])


def _up_first(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``[E, 2I, ...]`` gate rows then up rows -> each half padded to ``rows``, up first."""
    gate, up = t.chunk(2, dim=1)
    return torch.cat([_pad(up, 1, rows), _pad(gate, 1, rows)], dim=1)


@dataclass
class FlashInferExperts:
    """One layer's experts as FlashInfer's Hopper MXFP4 MoE reads them (``prepare_experts``)."""

    w13: torch.Tensor  # uint8 [E, 2I', H'/2], up rows first (interleaved for the kernel)
    w2: torch.Tensor  # uint8 [E, H', I'/2]
    scales: list[torch.Tensor]  # e8m0 of w13 and w2, folded into 64 x 128 blocks, as int32
    bias13: torch.Tensor | None  # bf16 [E, 2I'], up first
    bias2: torch.Tensor | None  # bf16 [E, H']
    swiglu: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # alpha, beta (1: up + 1), limit [E]
    hidden: int  # the model's H (x is padded to H')
    tuned: set[int]  # token counts the autotuner has seen

    @property
    def nbytes(self) -> int:
        held = [self.w13, self.w2, *self.scales, self.bias13, self.bias2]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


def padded_experts(w13: torch.Tensor, w2: torch.Tensor, scales: Mxfp4Scales,
                   bias: ExpertBias | None, act: MoeActivation) -> FlashInferExperts:
    """Packed MXFP4 experts (``[E, 2I, H/2]`` gate then up, ``[E, H, I/2]``, scales
    ``[E, rows, K/32]``) padded and reordered, before FlashInfer's interleaving (any device)."""
    e, hidden, inter = w13.shape[0], w2.shape[1], w2.shape[2] * 2
    hp, ip = _round_up(hidden), _round_up(inter)
    b13, b2 = bias if bias is not None else (None, None)
    dev = w13.device
    swiglu = tuple(torch.full((e,), float(v), device=dev) for v in (act.alpha, 1.0, act.limit))
    return FlashInferExperts(
        w13=_pad(_up_first(w13, ip), 2, hp // 2).contiguous(),
        w2=_pad(_pad(w2, 1, hp), 2, ip // 2).contiguous(),
        scales=[_pad(_up_first(scales.w13, ip), 2, hp // 32).contiguous(),
                _pad(_pad(scales.w2, 1, hp), 2, ip // 32).contiguous()],
        bias13=None if b13 is None else _up_first(b13[..., None], ip)[..., 0].bfloat16(),
        bias2=None if b2 is None else _pad(b2, 1, hp).bfloat16().contiguous(),
        swiglu=swiglu,  # type: ignore[arg-type]
        hidden=hidden, tuned=set())


def flashinfer_experts(w13: torch.Tensor, w2: torch.Tensor, scales: Mxfp4Scales,
                       bias: ExpertBias | None, act: MoeActivation) -> FlashInferExperts:
    """``padded_experts`` in the kernel's layout (CUDA: FlashInfer interleaves on the GPU)."""
    from flashinfer.fused_moe import (
        interleave_moe_scales_for_sm90_mixed_gemm,
        interleave_moe_weights_for_sm90_mixed_gemm,
    )

    e = padded_experts(w13, w2, scales, bias, act)
    e.w13, e.w2 = (interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4") for w in (e.w13, e.w2))
    e.scales = [interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32).view(torch.int32)
                for s in e.scales]
    return e


def flashinfer_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                   e: FlashInferExperts) -> torch.Tensor:
    """FlashInfer's fused MoE of ``x [T, H]`` (bf16) routed by ``ids``/``weights [T, K]``."""
    from flashinfer.autotuner import autotune
    from flashinfer.fused_moe import cutlass_fused_moe

    xp = _pad(x, 1, e.w2.shape[1])
    alpha, beta, limit = e.swiglu

    def call() -> torch.Tensor:
        return cutlass_fused_moe(xp, ids.to(torch.int32), weights.float(), e.w13, e.w2,
                                 torch.bfloat16, e.scales, fc1_expert_biases=e.bias13,
                                 fc2_expert_biases=e.bias2, swiglu_alpha=alpha,
                                 swiglu_beta=beta, swiglu_limit=limit,
                                 use_w4_group_scaling=True, use_fused_finalize=False)

    if x.shape[0] not in e.tuned and not torch.cuda.is_current_stream_capturing():
        e.tuned.add(x.shape[0])
        with autotune(True):
            call()
    return call()[:, :e.hidden].contiguous()  # the layers after read whole rows


class FlashInferMoeBackend(LibraryMoeBackend):
    name, capabilities, layout_type = "flashinfer", (_HOPPER, _NEXT), FlashInferExperts

    def __init__(self) -> None:
        import flashinfer.fused_moe  # noqa: F401  (fail at start-up, not at the first step)

        super().__init__()

    def convert(self, w13, w2, scales, bias, act) -> FlashInferExperts:
        return flashinfer_experts(w13, w2, scales, bias, act)

    def run(self, x, topk_weights, topk_ids, layout: FlashInferExperts) -> torch.Tensor:
        return flashinfer_moe(x, topk_weights, topk_ids, layout)
