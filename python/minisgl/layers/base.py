"""Base for layers whose parameters are loaded shard by shard from checkpoint tensors.

A parameter may carry a ``weight_loader(param, loaded, shard_id)`` attribute: it slices this rank's
part of the checkpoint tensor and copies it into the right place of a merged parameter (q/k/v into
``qkv_proj``, gate/up into ``gate_up_proj``, one expert into a stacked tensor). Without one, the
tensor is copied whole.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from minisgl.distributed import DistributedInfo

WeightLoader = Callable[[nn.Parameter, torch.Tensor, Any], None]


def new_param(*shape: int, loader: WeightLoader | None = None,
              dtype: torch.dtype | None = None, deferred: bool = False) -> nn.Parameter:
    """``dtype``: a storage type the model's cast to its compute dtype must keep (FP8 weights, their
    float32 scales); ``restore_param_dtypes`` puts it back after ``model.to(dtype)``.
    ``deferred``: no storage until its first checkpoint tensor arrives (``materialize``), for a
    weight that is quantized once its layer is loaded: the unquantized model never resides whole
    on the device, only the layers being loaded."""
    param = nn.Parameter(torch.empty(0 if deferred else shape, dtype=dtype), requires_grad=False)
    if deferred:
        param.deferred_shape = torch.Size(shape)  # type: ignore[attr-defined]
    if loader is not None:
        param.weight_loader = loader  # type: ignore[attr-defined]
    if dtype is not None:
        param.keep_dtype = dtype  # type: ignore[attr-defined]
    return param


def cast_floating(model: nn.Module, dtype: torch.dtype) -> None:
    """``model.to(dtype)`` in place: each floating parameter keeps its object (and attributes)
    and gets data of ``dtype``. Unlike ``Module.to`` it also casts fake tensors (a shadow run's,
    ``minisgl.warmup``), which ``Module.to`` would swap and cannot."""
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and buf.is_floating_point() and buf.dtype != dtype:
                module._buffers[name] = buf.to(dtype)


def restore_param_dtypes(model: nn.Module) -> None:
    """Undo ``model.to(dtype)`` for parameters made with a fixed storage dtype (not loaded yet, so
    only the allocation changes)."""
    for param in model.parameters():
        keep = getattr(param, "keep_dtype", None)
        if keep is not None and param.dtype != keep:
            param.data = torch.empty(param.shape, dtype=keep, device=param.device)


def materialize(param: nn.Parameter) -> None:
    """Give a deferred parameter (``new_param(deferred=True)``) its storage, in its current dtype
    and device; a no-op for any other."""
    shape = getattr(param, "deferred_shape", None)
    if shape is not None:
        param.data = torch.empty(shape, dtype=param.dtype, device=param.device)
        del param.deferred_shape


def copy_weight(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """``loaded``: a tensor, or a checkpoint tensor not read yet
    (``models.weight.CheckpointTensor``, which the loaders narrow to this rank's shard first, and
    which is read here)."""
    if param.shape != loaded.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, "
                         f"checkpoint {tuple(loaded.shape)}")
    param.data.copy_(loaded.load() if hasattr(loaded, "load") else loaded)


def copy_part(param: nn.Parameter, loaded: torch.Tensor, dim: int, dst: int, src: int, size: int,
              unit: int = 1) -> None:
    """Copy ``loaded[src : src + size]`` into ``param[dst : dst + size]`` along ``dim``.

    ``unit > 1``: both are block scales of a weight whose ranges are given in weight rows (or
    columns); a range must start on a block boundary and end on one or at the tensor's end, since a
    block split between two ranks or two merged projections has no scale of its own.
    """
    if unit > 1:
        ends = (-(-(src + size) // unit) == loaded.shape[dim]
                and -(-(dst + size) // unit) == param.shape[dim])
        if dst % unit or src % unit or (size % unit and not ends):
            raise ValueError(
                f"FP8 block scales cannot be split at {src}..{src + size} (block size {unit}): "
                "each tensor-parallel shard and merged projection must start and end on a block "
                "boundary")
        dst, src, size = dst // unit, src // unit, -(-size // unit)
    copy_weight(param.data.narrow(dim, dst, size), loaded.narrow(dim, src, size))


def shard(x: torch.Tensor, dim: int, tp: DistributedInfo) -> torch.Tensor:
    """This rank's equal slice of ``x`` along ``dim``."""
    size = x.shape[dim] // tp.size
    return x.narrow(dim, tp.rank * size, size)


def divide(n: int, d: int, what: str) -> int:
    if n % d != 0:
        raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size ({d})")
    return n // d
