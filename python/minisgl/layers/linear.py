"""Tensor-parallel linear layers: column-parallel (merged QKV, merged gate-up) and row-parallel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl import env
from minisgl.distributed import DistributedCommunicator, DistributedInfo

from .activation import silu_and_mul
from .base import copy_weight, divide, new_param, shard

USE_GEMV = env.GEMV.get() != "0"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           gated: bool = False) -> torch.Tensor:
    """``F.linear``. ``gated``: x is ``[gate | up]`` and the input is ``silu(gate) * up``. One token in
    half precision on CUDA goes through the Triton GEMV, which streams the weight faster than cuBLAS
    does at that shape and applies the gate as it reads x (benchmark/kernels/bench_gemv.py)."""
    if USE_GEMV and x.is_cuda and x.dim() == 2 and x.shape[0] == 1 \
            and x.dtype in (torch.bfloat16, torch.float16) and x.stride(1) == 1:
        from minisgl.kernel.triton.gemv import gemv

        return gemv(x, weight, bias, gated)
    return F.linear(silu_and_mul(x) if gated else x, weight, bias)


class LinearQKVMerged(nn.Module):
    """q, k and v projections in one GEMM; each rank holds its query heads and its KV heads.

    When there are fewer KV heads than ranks, KV heads are replicated: rank r uses KV head
    ``r * num_kv_heads // tp``.
    """

    def __init__(
        self, hidden: int, head_dim: int, num_qo: int, num_kv: int, bias: bool, tp: DistributedInfo
    ) -> None:
        super().__init__()
        self.tp, self.head_dim = tp, head_dim
        self.num_kv_total = num_kv
        self.local_qo = divide(num_qo, tp.size, "num_attention_heads")
        self.local_kv = divide(num_kv, tp.size, "num_key_value_heads") if num_kv >= tp.size else 1
        if num_kv < tp.size:
            divide(tp.size, num_kv, "tp size over num_key_value_heads")
        self.q_size, self.kv_size = self.local_qo * head_dim, self.local_kv * head_dim
        out = self.q_size + 2 * self.kv_size
        self.weight = new_param(out, hidden, loader=self._load)
        self.bias = new_param(out, loader=self._load) if bias else None

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str) -> None:
        if shard_id == "q":
            start, size, part = 0, self.q_size, shard(loaded, 0, self.tp)
        else:
            first_kv_head = self.tp.rank * self.num_kv_total // self.tp.size
            part = loaded.narrow(0, first_kv_head * self.head_dim, self.kv_size)
            start = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size = self.kv_size
        copy_weight(param.data.narrow(0, start, size), part)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class LinearColParallelMerged(nn.Module):
    """Several column-parallel projections of the same input in one GEMM (gate and up)."""

    def __init__(self, in_features: int, out_features: list[int], bias: bool, tp: DistributedInfo):
        super().__init__()
        self.tp = tp
        self.local_sizes = [divide(n, tp.size, "intermediate_size") for n in out_features]
        self.weight = new_param(sum(self.local_sizes), in_features, loader=self._load)
        self.bias = new_param(sum(self.local_sizes), loader=self._load) if bias else None

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int) -> None:
        start = sum(self.local_sizes[:shard_id])
        copy_weight(param.data.narrow(0, start, self.local_sizes[shard_id]), shard(loaded, 0, self.tp))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class LinearRowParallel(nn.Module):
    """Each rank multiplies its slice of the input features; the partial sums are all-reduced."""

    def __init__(self, in_features: int, out_features: int, bias: bool, comm: DistributedCommunicator):
        super().__init__()
        self.comm, tp = comm, comm.info
        self.weight = new_param(out_features, divide(in_features, tp.size, "row-parallel input"),
                                loader=lambda p, w, _: copy_weight(p, shard(w, 1, tp)))
        # NOTE: the bias is added after the all-reduce, so it is counted once, not tp times.
        self.bias = new_param(out_features) if bias else None

    def forward(self, x: torch.Tensor, gated: bool = False) -> torch.Tensor:
        """``gated``: x is ``[gate | up]`` of twice the input width; the input is silu(gate) * up."""
        y = self.comm.all_reduce(linear(x, self.weight, gated=gated))
        return y if self.bias is None else y + self.bias


class ReplicatedLinear(nn.Module):
    """A small linear layer every rank holds whole (the MoE router)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = new_param(out_features, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)
