"""The model's config as the engine loads it (its quantization resolved with ``--quantization``
and the kernel switches, checked against the device), and the checkpoint's KV-cache scales into
the pool."""

from __future__ import annotations

import dataclasses

import torch

from minisgl.kvcache import BaseKVCachePool
from minisgl.models import ModelConfig
from minisgl.quant import fp8_device_error, resolve_quantization
from minisgl.utils import init_logger

from .config import EngineConfig

logger = init_logger(__name__)


def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def _check_device(error: str | None, what: str) -> None:
    if error is not None:
        raise ValueError(f"{what}: {error}")


def load_model_config(config: EngineConfig, device: torch.device) -> ModelConfig:
    """``config.json`` with ``--quantization`` and the kernel switches applied, checked against
    the device. The result's ``quant`` is never None (``UnquantizedConfig`` without a format)."""
    mc = ModelConfig.from_path(config.model_path)
    quant = resolve_quantization(mc.quant, config.quantization, gemv=config.gemv,
                                 norm_gemv=config.norm_gemv, norm_quant=config.norm_quant)
    what = "quantization" if quant.online else f"{quant.name} checkpoint (quantization_config)"
    _check_device(quant.device_error(device.type, _capability(device)), what)
    if config.kv_cache_dtype == torch.float8_e4m3fn:
        _check_device(fp8_device_error(device.type, _capability(device)), "kv_cache_dtype")
    return dataclasses.replace(mc, quant=quant)


def set_kv_scales(pool: BaseKVCachePool, scales: dict[int, dict[str, float]]) -> None:
    """Per-layer K/V scales of the checkpoint into an FP8 pool (1.0 where it has none). A pool in
    the model's dtype stores K/V unscaled, so the scales do not apply to it."""
    if not scales:
        return
    if pool.dtype != torch.float8_e4m3fn:
        logger.info("the checkpoint's KV-cache scales apply to an FP8 KV cache only; not used")
        return
    for layer, kv in scales.items():
        pool.set_kv_scales(layer, kv.get("k", 1.0), kv.get("v", 1.0))
