"""Base for layers whose parameters are loaded shard by shard from checkpoint tensors.

A parameter may carry a ``weight_loader(param, loaded, shard_id)`` attribute: it slices this rank's
part of the checkpoint tensor and copies it into the right place of a merged parameter (q/k/v into
``qkv_proj``, gate/up into ``gate_up_proj``, one expert into a stacked tensor). Without one, the tensor
is copied whole.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from minisgl.distributed import DistributedInfo

WeightLoader = Callable[[nn.Parameter, torch.Tensor, Any], None]


def new_param(*shape: int, loader: WeightLoader | None = None) -> nn.Parameter:
    param = nn.Parameter(torch.empty(*shape), requires_grad=False)
    if loader is not None:
        param.weight_loader = loader  # type: ignore[attr-defined]
    return param


def copy_weight(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """``loaded``: a tensor, or a checkpoint tensor not read yet (``models.weight.CheckpointTensor``,
    which the loaders narrow to this rank's shard first, and which is read here)."""
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded.load() if hasattr(loaded, "load") else loaded)


def shard(x: torch.Tensor, dim: int, tp: DistributedInfo) -> torch.Tensor:
    """This rank's equal slice of ``x`` along ``dim``."""
    size = x.shape[dim] // tp.size
    return x.narrow(dim, tp.rank * size, size)


def divide(n: int, d: int, what: str) -> int:
    if n % d != 0:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size ({d})")
    return n // d
