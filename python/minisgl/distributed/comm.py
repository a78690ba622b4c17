"""Collectives of the tensor-parallel group, over ``torch.distributed``.

Two groups: tensors go over the device group (NCCL on CUDA, gloo on CPU); the control plane (the
messages rank 0 forwards, the agreed KV size) goes over a CPU group (gloo), so it never touches
the GPU stream.
"""

from __future__ import annotations

from datetime import timedelta

import torch

from .info import DistributedInfo


class DistributedCommunicator:
    """With a group of one every call is the identity and no process group exists."""

    def __init__(self, info: DistributedInfo, group=None, cpu_group=None) -> None:
        self.info = info
        self.group = group
        self.cpu_group = cpu_group

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

        x = x.contiguous()
        out = torch.empty((self.info.size * x.shape[0], *x.shape[1:]), dtype=x.dtype,
                          device=x.device)
        # all_gather_single is the name from torch 2.13 on (all_gather_into_tensor before)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, x, group=self.group)
        return torch.cat(out.chunk(self.info.size, dim=0), dim=dim)

    def min_int(self, value: int) -> int:
        """The smallest ``value`` over the ranks (e.g. the KV pages every rank can hold)."""
        if self.info.size == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's ``data`` on every rank (the others pass None)."""
        if self.info.size == 1:
            assert data is not None
            return data
        import torch.distributed as dist

        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.cpu_group)
        if self.info.is_primary:
            buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if data
                   else torch.empty(0, dtype=torch.uint8))
        else:
            buf = torch.empty(int(size.item()), dtype=torch.uint8)
        if int(size.item()):
            dist.broadcast(buf, src=0, group=self.cpu_group)
        return bytes(buf.numpy()) if not self.info.is_primary else data  # type: ignore[return-value]

    def close(self) -> None:
        """Leave the group (every process group of this process). Free CUDA graphs that captured
        collectives first: NCCL waits for them."""
        if self.info.size == 1:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def set_rank_threads(device: torch.device, size: int) -> None:
    """Torch CPU threads of one rank's process: one on GPU (the host only keeps books; more would
    spin against the other processes), an equal share of torch's default on CPU (the ranks compute
    side by side)."""
    if device.type == "cuda":
        torch.set_num_threads(1)
    elif size > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // size))


def init_distributed(
    info: DistributedInfo, init_addr: str, device: torch.device, timeout_s: float = 120.0
) -> DistributedCommunicator:
    """Join the TP group at ``init_addr`` (host:port of rank 0's rendezvous)."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://{init_addr}", world_size=info.size, rank=info.rank,
        timeout=timedelta(seconds=timeout_s),
    )
    cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else dist.group.WORLD
    return DistributedCommunicator(info, group=dist.group.WORLD, cpu_group=cpu_group)
