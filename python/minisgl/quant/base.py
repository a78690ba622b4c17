"""The quantization seam: a ``QuantizationConfig`` (from the checkpoint's ``quantization_config``
or the ``quantization`` option) gives every linear layer a ``LinearMethod`` and every MoE layer a
``MoEMethod`` at construction.

The method owns what differs between formats: which parameters the layer holds (``create_weights``),
what loading must remember (``on_load``), what happens once every tensor is in
(``process_weights_after_loading``: online quantization, a folded input scale) and which kernel a
forward runs (``apply``). The layers shard and load; the methods decide. Fusions a format offers
(an RMSNorm weight folded into the weight, a norm that quantizes the input, one-token
norm + GEMV + residual) are capabilities the layers ask about once, after loading. A
``MoEMethod`` does the same for a layer's stacked experts: their storage, what loading leaves to
do, and which storage the MoE backend is handed (the layer hands it over: a format never calls a
backend, so ``minisgl.moe`` sits above this package).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, NamedTuple

import torch

if TYPE_CHECKING:
    from torch import nn

    from minisgl.kernel.moe_types import Experts

# (shape, storage dtype or None for the model's dtype, block unit of a scale's loader, deferred:
# no storage before its first checkpoint tensor) -> parameter
MakeParam = Callable[..., "nn.Parameter"]


class QuantizedInput(NamedTuple):
    """A layer's input already quantized per token, as ``quantize_tokens`` would (``q [M, K]`` e4m3,
    ``scale [M, 1]`` fp32), by the kernel that made it (``kernel.triton.norm.rms_norm_quant``);
    ``dtype``: the activations' dtype, the layer's output dtype. A method takes it where its
    ``takes_quantized_input`` says so."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


class LinearMethod(ABC):
    """How one linear layer stores, loads and multiplies its weight ``[out, in]``.

    The layer (``layers.linear``) calls ``create_weights`` once in its constructor, ``on_load``
    before each checkpoint tensor is copied into one of its parameters, then
    ``process_weights_after_loading`` once (after the model's fusions) and ``apply`` every
    forward. ``apply``'s fused arguments (``norm_eps``, ``residual``, ``act``) are passed only where
    the capability below said yes.
    """

    # apply() takes norm_eps / residual / act (a one-token decode layer with no norm kernel)
    fuses_one_token: ClassVar[bool] = False

    @abstractmethod
    def create_weights(self, layer: nn.Module, out: int, inp: int, make_param: MakeParam) -> None:
        """Set ``layer.weight`` (and ``layer.weight_scale_inv``, None when unscaled) from
        ``make_param(*shape, dtype=..., unit=..., deferred=...)``: ``unit`` is the block size of a
        scale tensor along the layer's shard dimension (its ranges are the weight's, divided by
        it); ``deferred`` for a weight quantized after loading (no storage before its first
        tensor: the model's loader quantizes each decoder layer as soon as it is complete)."""

    def on_load(self, layer: nn.Module, param: nn.Parameter, loaded: Any) -> None:
        """Called before a checkpoint tensor (full, not yet sharded) is copied into ``param``."""

    def process_weights_after_loading(self, layer: nn.Module,
                                      input_scale: torch.Tensor | None = None) -> None:
        """Once the layer is loaded. ``input_scale [K]`` (only where ``folds_input_scale``):
        multiply it into the weight's columns first. Idempotent: a second call changes nothing."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor | QuantizedInput, bias: torch.Tensor | None,
              gated: bool = False, norm_eps: float | None = None,
              residual: torch.Tensor | None = None, act: bool = False) -> torch.Tensor:
        """``x [M, K]`` (``[M, 2K]`` = [gate | up] with ``gated``) -> ``[M, N]`` in x's dtype.
        ``norm_eps``: x is RMS-normalised (no weight) first; ``residual`` is added to the output;
        ``act``: the output is ``silu(gate) * up [M, N/2]``."""

    def folds_input_scale(self, layer: nn.Module) -> bool:
        """Whether ``process_weights_after_loading(input_scale=...)`` may fold an RMSNorm weight
        into this layer (its norm then runs with unit weights)."""
        return False

    def takes_quantized_input(self, layer: nn.Module, dtype: torch.dtype) -> bool:
        """Whether, on CUDA and for every batch of 2 or more tokens of ``dtype``, a
        ``QuantizedInput`` made by the norm before may replace x (after loading)."""
        return False


class MoEMethod(ABC):
    """How one MoE layer stores, loads and runs its stacked experts: ``w13 [E, 2I, H]`` (each
    expert's gate rows, then its up rows, this rank's I of them) and ``w2 [E, H, I]``, in the
    format's storage.

    The layer (``layers.moe``) shards and routes; it calls ``create_weights`` once in its
    constructor, ``process_weights_after_loading`` once, and every forward hands the MoE backend
    the storage ``experts`` returns with the routing decision. Checkpoint tensors reach the
    parameters through the layer's loaders, which cut this rank's rows (w13) or columns (w2);
    ``make_param``'s ``unit`` says how many weight rows (w13) or columns (w2) one index of the
    parameter's last sharded dimension covers.
    """

    @abstractmethod
    def create_weights(self, layer: nn.Module, experts: int, hidden: int, inter: int,
                       make_param: Callable[..., nn.Parameter]) -> None:
        """Set ``layer.w13``, ``layer.w2`` and the format's scales (``layer.w13_scale_inv``,
        ``layer.w2_scale_inv``, None when unscaled) from ``make_param(which, *shape, dtype=...,
        unit=..., deferred=...)``, ``which`` being ``"w13"`` or ``"w2"``."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Once the layer is loaded (online quantization). Idempotent."""

    @abstractmethod
    def experts(self, layer: nn.Module) -> Experts:
        """``(w13, w2, scales)``: the layer's experts as the backend runs them (``scales``: None
        in the model's dtype, ``FP8Scales`` or ``Mxfp4Scales``)."""


@dataclass(frozen=True)
class QuantizationConfig(ABC):
    """A model's weight format, chosen once at load. The keyword-only fields are the kernel
    switches of ablation runs (``EngineConfig``'s fields of the same names), carried here because
    the methods they steer are made from this config; every format honours them."""

    name: ClassVar[str]
    _: KW_ONLY
    gemv: bool = True  # one-token unquantized layers on CUDA: the Triton GEMV (False: cuBLAS)
    norm_gemv: bool = True  # one-token decode: the norm inside the GEMV where the method offers it
    norm_quant: bool = True  # batches: the norm quantizes the input where the method offers it

    @property
    def online(self) -> bool:
        """True when unquantized checkpoint weights are quantized at load."""
        return False

    @abstractmethod
    def linear_method(self) -> LinearMethod:
        """The method of the model's dense projections (QKV, o, gate-up, down)."""

    @abstractmethod
    def moe_method(self) -> MoEMethod:
        """The method of the model's MoE experts (the router is a dense layer no format
        quantizes)."""

    def device_error(self, device_type: str, capability: tuple[int, int] | None) -> str | None:
        """Why the device cannot run this format, or None."""
        return None

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor
                           ) -> Iterator[tuple[str, torch.Tensor]]:
        """A projection weight as a checkpoint of this format holds it (random weights of
        ``--dummy-weights``): the tensor itself unless the format stores it quantized."""
        yield name, tensor

    def checkpoint_names(self, name: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        """The names ``checkpoint_tensors`` yields for a weight of that name and shape, known
        before any tensor is made."""
        return (name,)
