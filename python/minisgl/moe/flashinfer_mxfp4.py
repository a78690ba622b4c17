"""MXFP4 experts through FlashInfer's CUTLASS fused MoE on Hopper: mixed-input grouped GEMMs that
read e2m1 weights with e8m0 scales and bf16 activations, the clamped SwiGLU in the first GEMM's
epilogue (``--moe-backend flashinfer``; ``pip install 'minisgl[flashinfer]'``). vLLM's other
Hopper path for gpt-oss, beside ``triton_kernels``.

Its kernels want K a multiple of 128: the scales go four groups at a time, each row's four
consecutive groups side by side (``_by_four``). gpt-oss's 2,880 is not, so ``prepare_experts``
pads the hidden and intermediate sizes to ``PAD`` with zero weights and biases (3,072 for
gpt-oss: 7% more bytes to read), puts each expert's up rows before its gate rows (the kernel's
order) and releases the layer's own copy; every forward pads x and slices the output. The
top-k sum is the deterministic one (the fused epilogue's atomics are not: greedy decoding must
not depend on the run). The kernel's tactic per token bucket is chosen by FlashInfer's autotuner
on the first eager call of that bucket (never while a graph captures: it times launches). Other
experts (bf16, FP8, other activations, other GPUs) take the fused Triton MoE (``moe.fused``).
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


def _by_four(scales: torch.Tensor) -> torch.Tensor:
    """``[E, N, K/32]`` e8m0 -> ``[E, K/128, 4N]``: each row's four consecutive groups together."""
    e, n, groups = scales.shape
    return scales.reshape(e, n, groups // 4, 4).permute(0, 2, 1, 3).reshape(e, groups // 4, 4 * n)


@dataclass
class FlashInferExperts:
    """One layer's experts as FlashInfer's Hopper MXFP4 MoE reads them (``prepare_experts``)."""

    w13: torch.Tensor  # uint8 [E, 2I', H'/2], up rows first
    w2: torch.Tensor  # uint8 [E, H', I'/2]
    scales: list[torch.Tensor]  # uint8 [E, H'/128, 8I'] and [E, I'/128, 4H']
    bias13: torch.Tensor | None  # bf16 [E, 2I'], up first
    bias2: torch.Tensor | None  # bf16 [E, H']
    swiglu: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # alpha, beta (1: up + 1), limit [E]
    hidden: int  # the model's H (x is padded to H')
    tuned: set[int]  # token counts the autotuner has seen

    @property
    def nbytes(self) -> int:
        held = [self.w13, self.w2, *self.scales, self.bias13, self.bias2]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


def flashinfer_experts(w13: torch.Tensor, w2: torch.Tensor, scales: Mxfp4Scales,
                       bias: ExpertBias | None, act: MoeActivation) -> FlashInferExperts:
    """The layout of packed MXFP4 experts (``[E, 2I, H/2]`` gate then up, ``[E, H, I/2]``)."""
    e, hidden, inter = w13.shape[0], w2.shape[1], w2.shape[2] * 2
    hp, ip = _round_up(hidden), _round_up(inter)
    b13, b2 = bias if bias is not None else (None, None)
    dev = w13.device
    swiglu = tuple(torch.full((e,), float(v), device=dev) for v in (act.alpha, 1.0, act.limit))
    return FlashInferExperts(
        w13=_pad(_up_first(w13, ip), 2, hp // 2).contiguous(),
        w2=_pad(_pad(w2, 1, hp), 2, ip // 2).contiguous(),
        scales=[_by_four(_pad(_up_first(scales.w13, ip), 2, hp // 32)).contiguous(),
                _by_four(_pad(_pad(scales.w2, 1, hp), 2, ip // 32)).contiguous()],
        bias13=None if b13 is None else _up_first(b13[..., None], ip)[..., 0].bfloat16(),
        bias2=None if b2 is None else _pad(b2, 1, hp).bfloat16().contiguous(),
        swiglu=swiglu,  # type: ignore[arg-type]
        hidden=hidden, tuned=set())


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
