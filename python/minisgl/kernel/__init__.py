"""Hand-written GPU kernels (Triton), used by the layers and backends when tensors live on CUDA.

Nothing here imports triton at module import time, so ``import minisgl.kernel`` works on a CPU-only
machine; each kernel module imports triton itself and is imported lazily by its caller.
"""

from __future__ import annotations

import importlib.util

import torch
from torch._subclasses.fake_tensor import FakeTensor


def triton_available() -> bool:
    """True when the ``triton`` package is installed (without importing it)."""
    return importlib.util.find_spec("triton") is not None


def aligned16(t: torch.Tensor) -> bool:
    """Whether ``t``'s data starts 16-byte aligned. A fake tensor (a warm-up's shadow run) has no
    address: only its view's offset decides, as allocations are aligned (CUDA's caching
    allocator hands out 512-byte blocks)."""
    if isinstance(t, FakeTensor):
        return t.storage_offset() * t.element_size() % 16 == 0
    return t.data_ptr() % 16 == 0


__all__ = ["aligned16", "triton_available"]
