"""Fused Triton MoE backend: alignment plus two grouped GEMMs (``minisgl.kernel.triton.fused_moe``),
for experts in the model's dtype, FP8 blocks or MXFP4 (decoded inside the GEMMs).

MXFP4 experts run in the word layout (``minisgl.quant.mxfp4.to_words``), which ``prepare_experts``
makes once from the checkpoint's bytes (``triton_fragments``: the fragment layout,
``minisgl.quant.mxfp4_fragments``); the other storages run as the layer holds them.

No host sync and buffers sized from the batch alone, so decode steps can be captured in CUDA graphs
(the torch reference reads per-expert counts back to the host and cannot be).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from minisgl.kernel.moe_types import FragmentScales, GluonFragmentScales
from minisgl.kernel.triton.fused_moe import fused_moe
from minisgl.quant.mxfp4 import to_words
from minisgl.quant.mxfp4_fragments import DEPTH, ROWS, fits_fragments, to_fragments
from minisgl.utils import init_logger

from .base import SILU, BaseMoeBackend, ExpertBias, Mxfp4Scales

logger = init_logger(__name__)


@dataclass
class WordExperts:
    """One layer's MXFP4 experts in the word layout (or the fragment layout, with
    ``FragmentScales``), with their scales and biases as loaded."""

    w13: torch.Tensor  # uint8 [E, 2I, H/2], each expert's words permuted (or in fragments)
    w2: torch.Tensor  # uint8 [E, H, I/2]
    scales: Mxfp4Scales
    bias: ExpertBias | None

    @property
    def nbytes(self) -> int:
        held = [self.w13, self.w2, *self.scales, *(self.bias or ())]
        return sum(t.numel() * t.element_size() for t in held if t is not None)


def _words(blocks: torch.Tensor) -> torch.Tensor:
    """``to_words`` one expert at a time: the conversion's temporaries stay an expert's size."""
    out = torch.empty_like(blocks)
    for e in range(blocks.shape[0]):
        out[e] = to_words(blocks[e])
    return out


class TritonMoeBackend(BaseMoeBackend):
    def prepare_experts(self, w13, w2, scales, bias, act) -> WordExperts | None:
        if not isinstance(scales, Mxfp4Scales):
            return None
        # detached: the layer empties its parameters once this returns
        held = ExpertBias(*(t if t is None else t.detach() for t in bias)) if bias else None
        return WordExperts(*self._layout(w13, w2, scales), held)

    @staticmethod
    def _layout(w13, w2, scales: Mxfp4Scales) -> tuple[torch.Tensor, torch.Tensor, Mxfp4Scales]:
        """A layer's MXFP4 experts and scales as the fused MoE reads them: the word layout."""
        return _words(w13), _words(w2), Mxfp4Scales(scales.w13.detach(), scales.w2.detach())

    def forward(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                topk_weights: torch.Tensor, topk_ids: torch.Tensor, scales=None, *, bias=None,
                act=SILU, pdl=False, layout=None) -> torch.Tensor:
        if isinstance(layout, WordExperts):
            w13, w2, scales, bias = layout.w13, layout.w2, layout.scales, layout.bias
        elif isinstance(scales, Mxfp4Scales):
            raise ValueError("MXFP4 experts run from prepare_experts' layout (the word layout)")
        if x.stride(-1) != 1:
            x = x.contiguous()
        return fused_moe(x, w13, w2, topk_weights, topk_ids, scales=scales, bias=bias, act=act,
                         pdl=pdl)


def _fragments(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``to_fragments`` one expert at a time."""
    words, frag_scales = torch.empty_like(blocks), torch.empty_like(scales)
    for e in range(blocks.shape[0]):
        words[e], frag_scales[e] = to_fragments(blocks[e], scales[e])
    return words, frag_scales


@functools.cache
def _warn_word_layout(w13: tuple[int, ...], w2: tuple[int, ...]) -> None:
    """Once a shape (every layer of a model has the same)."""
    logger.warning("MXFP4 experts of %s and %s: the fragment layout needs rows a multiple of %d "
                   "and K of %d, so they run in the word layout", w13, w2, ROWS, DEPTH)


class TritonFragmentsMoeBackend(TritonMoeBackend):
    """The fused Triton MoE with MXFP4 experts in the fragment layout
    (``quant.mxfp4_fragments``): every batch on that layout's GEMV and GEMM
    (``kernel.triton.moe_mxfp4_frag``). Experts the layout cannot hold (rows not a multiple of
    16, or K not of 64) run in the word layout, with a warning."""

    @staticmethod
    def _layout(w13, w2, scales: Mxfp4Scales) -> tuple[torch.Tensor, torch.Tensor, Mxfp4Scales]:
        if not all(fits_fragments(w.shape[-2], 2 * w.shape[-1]) for w in (w13, w2)):
            _warn_word_layout(tuple(w13.shape), tuple(w2.shape))
            return TritonMoeBackend._layout(w13, w2, scales)
        (f13, t13), (f2, t2) = _fragments(w13, scales.w13), _fragments(w2, scales.w2)
        return f13, f2, FragmentScales(t13, t2)


class GluonFragmentsMoeBackend(TritonFragmentsMoeBackend):
    """``triton_fragments`` with the tiles of ``GLUON_TILES`` on the Gluon kernel
    (``kernel.triton.moe_mxfp4_gluon``: bf16 on Hopper, gpt-oss's SwiGLU; elsewhere the Triton
    tiles). Its tiles are tested against the word layout's GEMMs and timed per GPU
    (``gpu_validate.sh moe-gluon``, ``moe-tune-gluon``), the engine with it against the default
    (``moe-gluon-ab``)."""

    @staticmethod
    def _layout(w13, w2, scales: Mxfp4Scales) -> tuple[torch.Tensor, torch.Tensor, Mxfp4Scales]:
        f13, f2, frag = TritonFragmentsMoeBackend._layout(w13, w2, scales)
        if not isinstance(frag, FragmentScales):  # the word layout
            return f13, f2, frag
        return f13, f2, GluonFragmentScales(*frag)
