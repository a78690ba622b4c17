"""What an engine runs on, built the same for the warm-up's shadow engine (``minisgl.warmup``):
its model with its weights loaded, and a KV pool with its attention backend."""

from __future__ import annotations

import torch

from minisgl.attention import BaseAttnBackend, create_attention_backend
from minisgl.distributed import DistributedCommunicator
from minisgl.kvcache import BaseKVCachePool, create_kvcache_pool
from minisgl.kvcache.spec import CacheSpec
from minisgl.layers.base import cast_floating, restore_param_dtypes
from minisgl.models import BaseLLMModel, ModelConfig, get_model_class
from minisgl.models.weight import dummy_weights, iter_weights
from minisgl.moe import create_moe_backend

from .config import EngineConfig
from .loading import set_kv_scales


def build_model(config: EngineConfig, mc: ModelConfig, comm: DistributedCommunicator,
                device: torch.device, shadow: bool = False) -> BaseLLMModel:
    """The model of ``config`` on ``device``, its weights loaded. ``shadow``: a shadow run's
    (``minisgl.warmup``), loaded with uninitialised dummy weights: a quantized layer's shapes
    and dtypes come out of loading."""
    cls = get_model_class(mc.architecture)
    moe = create_moe_backend(config.moe_backend)
    with torch.device(device):
        model = cls(mc, comm, moe)
        if config.mtp:
            if not hasattr(model, "add_mtp"):
                raise ValueError(f"speculative_config: method 'mtp' needs a model with an "
                                 f"MTP head; {mc.architecture} has none")
            model.add_mtp(comm, moe)
    cast_floating(model, config.dtype)
    model.eval()
    restore_param_dtypes(model)
    for module in model.modules():  # the layers that launch Triton kernels: fixed here, once
        if hasattr(module, "pdl"):
            module.pdl = config.pdl
    dummy = config.dummy_weights or shadow
    if dummy:
        model.load_weights(dummy_weights(mc, config.seed, device, config.dtype,
                                         values=not shadow))
    else:
        model.load_weights(iter_weights(config.model_path))
    if config.draft_model_path is not None:  # after the target's weights: not in them
        from minisgl.models.eagle3 import load_eagle3

        model.add_eagle3(load_eagle3(config.draft_model_path, model, config.dtype, device,
                                     dummy, config.seed))
    return model


def make_pool(config: EngineConfig, mc: ModelConfig, spec: CacheSpec,
              kv_scales: dict[int, dict[str, float]], page_table: torch.Tensor,
              window_page_table: torch.Tensor | None, num_pages: int,
              window_pages: int | None = None) -> tuple[BaseKVCachePool, BaseAttnBackend]:
    """A KV pool of ``num_pages`` pages for the layers of ``spec`` and its attention backend."""
    pool = create_kvcache_pool(spec, num_pages, config.page_size, config.kv_dtype,
                               page_table.device, window_pages)
    set_kv_scales(pool, kv_scales)
    backend = create_attention_backend(config.attention_backend, pool, page_table)
    try:  # refuses a window or sinks it cannot do; the model's family named
        backend.check_layers(list(spec.layers))
    except ValueError as exc:
        raise ValueError(f"{mc.architecture}: {exc}") from None
    if window_pages:
        assert window_page_table is not None
        backend.set_window_page_table(window_page_table)
    backend.pdl = config.pdl
    return pool, backend
