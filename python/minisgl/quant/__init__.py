"""Quantized weights and KV cache. ``base``: the seam (``QuantizationConfig``, ``LinearMethod``,
``MoEMethod``); one module per format (``unquantized``, ``fp8_channel``, ``fp8_block``,
``mxfp4_moe``); ``config``: which format a model runs with (``CHECKPOINT_FORMATS``);
``fp8_dispatch``: the FP8 kernel decision table; ``fp8`` and ``mxfp4``: the layouts' torch
references (kernels in ``minisgl.kernel.triton``)."""

from .base import (
    LinearMethod,
    MoEMethod,
    QuantizationConfig,
    QuantizedInput,
)
from .config import (
    CHECKPOINT_FORMATS,
    QUANTIZATIONS,
    Fp8Config,
    config_from_checkpoint,
    fp8_device_error,
    resolve_quantization,
)
from .fp8 import (
    FP8,
    FP8_MAX,
    block_gemm_reference,
    channel_gemm_reference,
    dequantize_block,
    dequantize_channel,
    quantize_block,
    quantize_channel,
    quantize_groups,
    quantize_kv,
)
from .fp8_dispatch import fp8_linear
from .mxfp4 import dequantize_mxfp4, quantize_mxfp4
from .mxfp4_moe import Mxfp4Config
from .unquantized import (
    UnquantizedConfig,
    linear,
    linear_method,
    moe_method,
    unquantized_method,
)

KV_CACHE_DTYPES = ("auto", "fp8_e4m3")

__all__ = [
    "CHECKPOINT_FORMATS", "FP8", "FP8_MAX", "KV_CACHE_DTYPES", "QUANTIZATIONS", "Fp8Config",
    "LinearMethod", "MoEMethod", "Mxfp4Config", "QuantizationConfig", "QuantizedInput",
    "UnquantizedConfig", "block_gemm_reference", "channel_gemm_reference", "config_from_checkpoint",
    "dequantize_block", "dequantize_channel", "dequantize_mxfp4", "fp8_device_error",
    "fp8_linear", "linear", "linear_method", "moe_method", "quantize_block", "quantize_channel",
    "quantize_groups", "quantize_kv", "quantize_mxfp4", "resolve_quantization",
    "unquantized_method",
]
