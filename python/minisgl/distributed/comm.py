"""All-reduce and all-gather across the tensor-parallel group, over ``torch.distributed``."""

from __future__ import annotations

import torch

from .info import DistributedInfo


class DistributedCommunicator:
    """Collectives of one TP group; with a group of one every call is the identity (no process group)."""

    def __init__(self, info: DistributedInfo, group=None) -> None:
        self.info = info
        self.group = group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.info.size == 1:
            return x
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim`` (rank order)."""
        if self.info.size == 1:
            return x
        import torch.distributed as dist

        out = torch.empty((self.info.size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x.contiguous(), group=self.group)
        return torch.cat(out.unbind(0), dim=dim)
