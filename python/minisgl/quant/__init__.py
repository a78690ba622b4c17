"""Quantized weights and KV cache: the FP8 (e4m3; block-scaled or per-channel) formats, its torch reference and the
linear method the layers call (kernels in ``minisgl.kernel.triton.fp8_*``)."""

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
from .linear import fp8_linear

KV_CACHE_DTYPES = ("auto", "fp8_e4m3")

__all__ = [
    "FP8", "FP8_MAX", "KV_CACHE_DTYPES", "QUANTIZATIONS", "Fp8Config", "block_gemm_reference",
    "channel_gemm_reference", "dequantize_block", "dequantize_channel", "fp8_config_from_checkpoint",
    "fp8_device_error", "fp8_linear",
    "quantize_block", "quantize_channel", "quantize_groups", "quantize_kv", "resolve_quantization",
]
