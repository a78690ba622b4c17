"""Hand-written GPU kernels (Triton), used by the layers and backends when tensors live on CUDA.

Nothing here imports triton at module import time, so ``import minisgl.kernel`` works on a CPU-only
machine; each kernel module imports triton itself and is imported lazily by its caller.
"""

from __future__ import annotations

import importlib.util


def triton_available() -> bool:
    """True when the ``triton`` package is installed (without importing it)."""
    return importlib.util.find_spec("triton") is not None


__all__ = ["triton_available"]
