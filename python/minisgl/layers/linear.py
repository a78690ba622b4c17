"""Tensor-parallel linear layers: column-parallel (merged QKV, merged gate-up) and row-parallel.

A layer shards and loads; its ``LinearMethod`` (``minisgl.quant``, from the model's quantization
config) decides which parameters it holds (a weight in the model's dtype, or e4m3 with
``weight_scale_inv``), what happens after loading (online quantization) and which kernel runs. A
scale tensor is loaded shard by shard like the weight, its ranges the weight's divided by the
block size (``copy_part``'s ``unit``). The fusion capabilities (``can_fold_input_scale``,
``takes_quantized_input``, ``fuses_one_token``) are the method's, asked by
``layers.fusion.fuse_norms``.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator, DistributedInfo
from minisgl.quant import QuantizationConfig, linear, linear_method, unquantized_method

from .base import copy_part, divide, materialize, new_param

__all__ = ["LinearColParallelMerged", "LinearQKVMerged", "LinearRowParallel", "ReplicatedLinear",
           "linear"]


class _Linear(nn.Module):
    """A weight ``[out, in]`` sharded along ``shard_dim`` by ``_place``; the method from
    ``quant``."""

    shard_dim = 0
    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def _place(self, shard_id) -> tuple[int, int, int]:
        """(first row of this part in the local weight, first row in the checkpoint, rows)."""
        raise NotImplementedError

    def _init_weight(self, out: int, inp: int, quant: QuantizationConfig | None) -> None:
        self.method = linear_method(quant)
        self.method.create_weights(self, out, inp, self._new_param)

    def _new_param(self, *shape: int, dtype: torch.dtype | None = None, unit: int = 1,
                   deferred: bool = False) -> nn.Parameter:
        return new_param(*shape, loader=functools.partial(self._load, unit=unit), dtype=dtype,
                         deferred=deferred)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id, unit: int = 1) -> None:
        materialize(param)
        dim = self.shard_dim if param.dim() == 2 else 0
        self.method.on_load(self, param, loaded)
        copy_part(param, loaded, dim, *self._place(shard_id), unit=unit)

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False,
                norm_eps: float | None = None, residual: torch.Tensor | None = None,
                act: bool = False) -> torch.Tensor:
        """``norm_eps``, ``residual`` and ``act``: see ``LinearMethod.apply`` (only where
        ``fuses_one_token``)."""
        return self.method.apply(self, x, bias, gated, norm_eps, residual, act)

    def process_weights_after_loading(self) -> None:
        self.method.process_weights_after_loading(self)

    @property
    def can_fold_input_scale(self) -> bool:
        return self.method.folds_input_scale(self)

    def fold_input_scale_(self, scale: torch.Tensor) -> None:
        """Multiply ``scale [K]`` into the weight's columns as the method processes it (an RMSNorm
        weight folded into the layer it feeds; only where ``can_fold_input_scale``)."""
        assert self.can_fold_input_scale
        self.method.process_weights_after_loading(self, input_scale=scale)

    def takes_quantized_input(self, dtype: torch.dtype) -> bool:
        return self.method.takes_quantized_input(self, dtype)

    @property
    def fuses_one_token(self) -> bool:
        return self.method.fuses_one_token


class LinearQKVMerged(_Linear):
    """q, k and v projections in one GEMM; each rank holds its query heads and its KV heads.

    When there are fewer KV heads than ranks, KV heads are replicated: rank r uses KV head
    ``r * num_kv_heads // tp``.
    """

    def __init__(self, hidden: int, head_dim: int, num_qo: int, num_kv: int, bias: bool,
                 tp: DistributedInfo, quant: QuantizationConfig | None = None) -> None:
        super().__init__()
        self.tp, self.head_dim = tp, head_dim
        self.num_kv_total = num_kv
        self.local_qo = divide(num_qo, tp.size, "num_attention_heads")
        self.local_kv = divide(num_kv, tp.size, "num_key_value_heads") if num_kv >= tp.size else 1
        if num_kv < tp.size:
            divide(tp.size, num_kv, "tp size over num_key_value_heads")
        self.q_size, self.kv_size = self.local_qo * head_dim, self.local_kv * head_dim
        out = self.q_size + 2 * self.kv_size
        self._init_weight(out, hidden, quant)
        self.bias = new_param(out, loader=self._load) if bias else None

    def _place(self, shard_id: str) -> tuple[int, int, int]:
        if shard_id == "q":
            return 0, self.tp.rank * self.q_size, self.q_size
        first_kv_head = self.tp.rank * self.num_kv_total // self.tp.size
        dst = self.q_size + (0 if shard_id == "k" else self.kv_size)
        return dst, first_kv_head * self.head_dim, self.kv_size

    def forward(self, x: torch.Tensor, norm_eps: float | None = None) -> torch.Tensor:
        return self._matmul(x, self.bias, norm_eps=norm_eps)


class LinearColParallelMerged(_Linear):
    """Several column-parallel projections of the same input in one GEMM (gate and up)."""

    def __init__(self, in_features: int, out_features: list[int], bias: bool, tp: DistributedInfo,
                 quant: QuantizationConfig | None = None):
        super().__init__()
        self.tp = tp
        self.local_sizes = [divide(n, tp.size, "intermediate_size") for n in out_features]
        self._init_weight(sum(self.local_sizes), in_features, quant)
        self.bias = new_param(sum(self.local_sizes), loader=self._load) if bias else None

    def _place(self, shard_id: int) -> tuple[int, int, int]:
        size = self.local_sizes[shard_id]
        return sum(self.local_sizes[:shard_id]), self.tp.rank * size, size

    def forward(self, x: torch.Tensor, norm_eps: float | None = None,
                act: bool = False) -> torch.Tensor:
        """``act`` (FP8 gate and up): the output is ``silu(gate) * up``."""
        assert not act or len(self.local_sizes) == 2 and self.local_sizes[0] == self.local_sizes[1]
        return self._matmul(x, self.bias, norm_eps=norm_eps, act=act)


class LinearRowParallel(_Linear):
    """Each rank multiplies its slice of the input features; the partial sums are all-reduced."""

    shard_dim = 1

    def __init__(self, in_features: int, out_features: int, bias: bool,
                 comm: DistributedCommunicator, quant: QuantizationConfig | None = None):
        super().__init__()
        self.comm, tp = comm, comm.info
        self.local_in = divide(in_features, tp.size, "row-parallel input")
        self._init_weight(out_features, self.local_in, quant)
        # NOTE: the bias is added after the all-reduce, so it is counted once, not tp times (on
        # one rank, by the matmul itself: no launch of its own)
        self.bias = new_param(out_features) if bias else None

    def _place(self, shard_id: None) -> tuple[int, int, int]:
        return 0, self.comm.info.rank * self.local_in, self.local_in

    def forward(self, x: torch.Tensor, gated: bool = False,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """``gated``: x is ``[gate | up]`` of twice the input width; the input is silu(gate) * up.
        ``residual``: added to the output inside the FP8 layer's kernel (one rank only)."""
        assert residual is None or self.comm.info.size == 1, "the fused residual add is TP=1's"
        if self.comm.info.size == 1:
            return self._matmul(x, self.bias, gated=gated, residual=residual)
        y = self.comm.all_reduce(self._matmul(x, gated=gated))
        return y if self.bias is None else y + self.bias


class ReplicatedLinear(nn.Module):
    """A small linear layer every rank holds whole (the MoE router; never quantized, as in the
    published FP8 and MXFP4 checkpoints)."""

    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def __init__(self, in_features: int, out_features: int,
                 quant: QuantizationConfig | None = None, bias: bool = False) -> None:
        super().__init__()
        self.method = unquantized_method(quant)
        self.method.create_weights(self, out_features, in_features, new_param)
        self.bias = new_param(out_features) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)
