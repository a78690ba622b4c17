"""Quantized weights and KV cache. ``base``: the seam (``QuantizationConfig``, ``LinearMethod``);
one module per format (``unquantized``, ``fp8_channel``, ``fp8_block``); ``config``: which format
a model runs with; ``fp8_dispatch``: the FP8 kernel decision table; ``fp8``: the FP8 layouts'
torch reference (kernels in ``minisgl.kernel.triton.fp8_*``)."""

from .base import (
    LinearMethod,
    QuantizationConfig,
    QuantizedInput,
)
from .config import (
    QUANTIZATIONS,
    Fp8Config,
    fp8_config_from_checkpoint,
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
from .unquantized import UnquantizedConfig, linear, linear_method, unquantized_method

KV_CACHE_DTYPES = ("auto", "fp8_e4m3")

__all__ = [
    "FP8", "FP8_MAX", "KV_CACHE_DTYPES", "QUANTIZATIONS", "Fp8Config", "LinearMethod",
    "QuantizationConfig", "QuantizedInput", "UnquantizedConfig", "block_gemm_reference",
    "channel_gemm_reference", "dequantize_block", "dequantize_channel",
    "fp8_config_from_checkpoint",
    "fp8_device_error", "fp8_linear", "linear", "linear_method", "quantize_block",
    "quantize_channel", "quantize_groups", "quantize_kv", "resolve_quantization",
    "unquantized_method",
]
