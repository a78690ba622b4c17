"""How a scheduler's engine starts with its kernel warm-up: the kernel cache opened and the
warm-up started first (``KernelWarmup``: it compiles beside the engine's start-up), the engine
built, and the warm-up stopped again if the engine fails to start (its compile processes end
with it)."""

from __future__ import annotations

import dataclasses
import time

import torch

from minisgl.engine import Engine, EngineConfig
from minisgl.utils import init_logger

from .kernels import KernelWarmup

logger = init_logger(__name__)


def engine_with_warmup(config: EngineConfig) -> tuple[Engine, KernelWarmup | None]:
    """The engine of ``config``, and its kernel warm-up (None off CUDA or without
    ``precompile``)."""
    kernels = start_kernel_warmup(config)
    try:
        return Engine(config, kernels=kernels), kernels
    except BaseException:
        if kernels is not None:
            kernels.close()
        raise


def start_kernel_warmup(config: EngineConfig) -> KernelWarmup | None:
    """Open the kernel cache of the engine of ``config`` (Triton's directory is set for this
    process) and, with ``precompile``, start its kernel warm-up from the cache's plan, if it has
    one; None off CUDA (the CPU path compiles nothing) or without ``precompile``."""
    if config.device.type != "cuda":
        return None
    from minisgl.utils.hf import has_tokenizer

    from .cache import model_key, open_kernel_cache

    start = time.perf_counter()
    device = config.device
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cache = open_kernel_cache(config.kernel_cache_dir, device)
    if not config.precompile:
        return None
    grammar = has_tokenizer(config.model_path)  # without one no request can carry a grammar
    key, what = model_key(config, grammar)
    kernels = cache.load_plan(key)
    # the seconds: CUDA's start in this process, the cache's opening (a carried one's group
    # files rewritten) and its plan read
    logger.info("kernel cache %s: %s (%.1f s)", cache.dir,
                "plan found" if kernels else "no plan yet", time.perf_counter() - start)
    return KernelWarmup(dataclasses.replace(config, device=device), grammar, kernels=kernels,
                        on_found=lambda found: cache.save_plan(key, found, what),
                        peaks=cache.load_peaks(key),
                        on_peaks=lambda peaks: cache.save_peaks(key, peaks),
                        finished_before=cache.finished(key),
                        on_done=lambda: cache.mark_finished(key)).start()
