"""Which quantization a model runs with: parsed from the checkpoint's ``quantization_config`` or
asked for with ``--quantization`` (then the weights are quantized while loading):

* ``fp8``: dense weights per output channel (``fp8_channel``); MoE experts in 128x128 blocks.
* ``fp8-block``: dense weights and experts in 128x128 blocks, the FP8 checkpoints' format
  (``fp8_block``).

A checkpoint's format comes from ``CHECKPOINT_FORMATS`` (its ``quant_method``): ``fp8``, the
published FP8 checkpoints' (Qwen3-*-FP8, DeepSeek-V3: e4m3 weights with one ``weight_scale_inv``
per ``weight_block_size`` block, activations quantized dynamically per token and column group), and
``mxfp4``, gpt-oss's (MoE experts in MXFP4, everything else unquantized: ``mxfp4_moe``). Anything
else is refused by name rather than loaded wrongly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

import torch

from .base import LinearMethod, MoEMethod, QuantizationConfig
from .fp8 import quantize_block
from .mxfp4_moe import Mxfp4Config
from .unquantized import UnquantizedConfig

QUANTIZATIONS = ("fp8", "fp8-block")
DEFAULT_BLOCK = (128, 128)


@dataclass(frozen=True)
class Fp8Config(QuantizationConfig):
    """``block``: (rows, columns) of the weight that share one scale; the activation groups are
    ``block[1]`` columns wide, so a GEMM's K loop meets one weight scale and one activation scale
    per step. ``online``: the checkpoint holds bf16/fp16/fp32 weights that are quantized at load."""

    name: ClassVar[str] = "fp8"
    block: tuple[int, int] = DEFAULT_BLOCK
    online: bool = False  # type: ignore[assignment]
    # online only: one scale per output channel of each dense projection ([N, 1], activations per
    # token, ``torch._scaled_mm``) instead of ``block`` scales. MoE experts keep ``block`` scales
    # (the fused MoE kernel reads block scales only).
    channel: bool = False

    def __post_init__(self) -> None:
        if len(self.block) != 2 or any(not isinstance(b, int) or b < 1 for b in self.block):
            raise ValueError(f"quantization_config.weight_block_size: must be two positive "
                             f"integers, got {list(self.block)}")
        if self.block[1] & (self.block[1] - 1) or self.block[1] < 16:
            raise ValueError(f"quantization_config.weight_block_size: the column block must be a "
                             f"power of two >= 16 (the GEMM's K step), got {self.block[1]}")
        if self.channel and not self.online:
            raise ValueError("per-channel FP8 is an online quantization (--quantization fp8)")

    def linear_method(self) -> LinearMethod:
        if self.channel:
            from .fp8_channel import Fp8ChannelLinearMethod

            return Fp8ChannelLinearMethod(self.norm_gemv, self.norm_quant)
        from .fp8_block import Fp8BlockLinearMethod

        return Fp8BlockLinearMethod(self.block, self.online)

    def moe_method(self) -> MoEMethod:
        from .fp8_block import Fp8MoEMethod

        return Fp8MoEMethod(self.block, self.online)

    def device_error(self, device_type: str, capability: tuple[int, int] | None) -> str | None:
        return fp8_device_error(device_type, capability)

    def checkpoint_tensors(self, name: str, tensor: torch.Tensor
                           ) -> Iterator[tuple[str, torch.Tensor]]:
        if self.online:
            yield name, tensor
            return
        q, scale_inv = quantize_block(tensor, self.block)
        yield name, q
        yield name + "_scale_inv", scale_inv

    def checkpoint_names(self, name: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        return (name,) if self.online else (name, name + "_scale_inv")


def _fp8_from_checkpoint(q: dict[str, Any]) -> Fp8Config:
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"quantization_config.fmt: {fmt!r} is not supported (e4m3)")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ValueError(f"quantization_config.activation_scheme: {scheme!r} is not supported "
                         "(dynamic: activations are quantized per token and column group)")
    block = q.get("weight_block_size")
    if block is None:
        raise ValueError("quantization_config.weight_block_size: missing; only block-scaled FP8 "
                         "checkpoints (weight_scale_inv per block) are supported, not per-tensor "
                         "ones")
    return Fp8Config(block=tuple(int(b) for b in block))


def _mxfp4_from_checkpoint(q: dict[str, Any]) -> Mxfp4Config:
    return Mxfp4Config()


# quant_method of a checkpoint's quantization_config -> its config's parser
CHECKPOINT_FORMATS: dict[str, Callable[[dict[str, Any]], QuantizationConfig]] = {
    "fp8": _fp8_from_checkpoint,
    "mxfp4": _mxfp4_from_checkpoint,
}


def config_from_checkpoint(raw: dict[str, Any]) -> QuantizationConfig | None:
    """The format of a ``config.json`` dict's ``quantization_config`` (``CHECKPOINT_FORMATS``),
    or None when the model is unquantized."""
    q = raw.get("quantization_config")
    if not q:
        return None
    method = q.get("quant_method")
    if method not in CHECKPOINT_FORMATS:
        raise ValueError(f"quantization_config.quant_method: {method!r} is not supported "
                         f"({', '.join(CHECKPOINT_FORMATS)})")
    return CHECKPOINT_FORMATS[method](q)


def resolve_quantization(checkpoint: QuantizationConfig | None, option: str | None,
                         **switches: bool) -> QuantizationConfig:
    """The checkpoint's own format wins; ``option`` quantizes an unquantized checkpoint (``fp8``:
    per channel, ``fp8-block``: 128x128 blocks). ``switches``: the kernel switches
    (``QuantizationConfig``'s keyword fields), applied to whichever config results."""
    if option is not None and option not in QUANTIZATIONS:
        raise ValueError(f"quantization: {option!r} is not one of {', '.join(QUANTIZATIONS)}")
    if checkpoint is not None:
        quant = checkpoint
    elif option is None:
        quant = UnquantizedConfig()
    else:
        quant = Fp8Config(online=True, channel=option == "fp8")
    return dataclasses.replace(quant, **switches)


def fp8_device_error(device_type: str, capability: tuple[int, int] | None) -> str | None:
    """Why ``device`` cannot run FP8 weights, or None. CPU runs the dequantizing reference; CUDA
    needs e4m3 tensor cores and conversions: compute capability 8.9 (Ada) or 9.0 (Hopper) and up."""
    if device_type == "cpu":
        return None
    if device_type != "cuda":
        return f"FP8 is not supported on device type {device_type!r}"
    if capability is None or capability < (8, 9):
        cap = "unknown" if capability is None else f"{capability[0]}.{capability[1]}"
        return (f"FP8 weights and KV cache need a GPU of compute capability 8.9 or newer "
                f"(Ada, Hopper); this GPU has {cap}. Serve the bf16 checkpoint instead")
    return None
