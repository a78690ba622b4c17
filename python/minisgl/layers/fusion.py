"""Norm fusions a decoder layer may use, decided once after loading from what the linear methods
offer (``LinearMethod``'s capabilities); a model file names its norms and the layers they feed
and asks, and never looks at the quantization format.

* folded: each RMSNorm's weight is multiplied into the columns of the projection it feeds, and
  becomes ones: ``W @ (g * n) == (W * g) @ n``. Only when every projection can take it.
* one token: the folded projections normalise x themselves and the output projections add the
  residual, so a one-token step runs no norm kernel (``fuses_one_token`` of every projection of
  the layer, one rank).
* quantized inputs: batches of 2+ tokens on CUDA get the norm's output quantized per token by the
  norm kernel, in place of the projection's own quantization (``takes_quantized_input``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from torch import nn

from .norm import RMSNorm


@dataclass(frozen=True)
class NormFusion:
    folded: bool = False
    one_token: bool = False
    quantized_inputs: bool = False


def fuse_norms(pairs: Sequence[tuple[RMSNorm, nn.Module | None]],
               projections: Iterable[nn.Module], tp_size: int) -> NormFusion:
    """``pairs``: (norm, the linear layer it feeds, or None where that is no single linear layer,
    e.g. an MoE block); ``projections``: every linear layer of the decoder layer (all must fuse
    for the one-token path). Folds the norms when every fed layer can, and says what is fused."""
    if not all(linear is not None and getattr(linear, "can_fold_input_scale", False)
               for _, linear in pairs):
        return NormFusion()
    for norm, linear in pairs:
        linear.fold_input_scale_(norm.weight.data)
        norm.weight.data.fill_(1.0)
    one_token = tp_size == 1 and all(p.fuses_one_token for p in projections)
    quantized = all(linear.takes_quantized_input(norm.weight.dtype) for norm, linear in pairs)
    return NormFusion(True, one_token, quantized)
