"""Tensor-parallel linear layers: column-parallel (merged QKV, merged gate-up) and row-parallel.

With an FP8 config (``minisgl.quant``) a layer's weight is e4m3 with block scales
(``weight_scale_inv``), loaded shard by shard like the weight (the scales' ranges are the weight's,
divided by the block size); with ``online`` it loads the checkpoint's weight as usual and quantizes
it in ``quantize_weights_`` once loading is done: per output channel (``scale [N, 1]``, the default)
or into blocks (``MINISGL_FP8_GEMM=block``).

Tensor parallelism and per-channel scales: a column-parallel shard holds whole rows, so its rows'
scales are TP=1's; a row-parallel shard holds part of each row, so the loader keeps the largest
magnitude of every whole checkpoint row (``_row_amax``) and the shard is quantized with it. Either
way every TP size holds the values TP=1 holds (the block-boundary check of ``copy_part`` concerns
block scales loaded from a checkpoint only).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from minisgl import env
from minisgl.distributed import DistributedCommunicator, DistributedInfo
from minisgl.quant import FP8, Fp8Config, fp8_linear, quantize_block, quantize_channel

from .activation import silu_and_mul
from .base import copy_part, divide, new_param

USE_GEMV = env.GEMV.get() != "0"


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           gated: bool = False, pdl: bool = False) -> torch.Tensor:
    """``F.linear``. ``gated``: x is ``[gate | up]`` and the input is ``silu(gate) * up``. One token in
    half precision on CUDA goes through the Triton GEMV, which streams the weight faster than cuBLAS
    does at that shape and applies the gate as it reads x (benchmark/kernels/bench_gemv.py)."""
    if USE_GEMV and x.is_cuda and x.dim() == 2 and x.shape[0] == 1 \
            and x.dtype in (torch.bfloat16, torch.float16) and x.stride(1) == 1:
        from minisgl.kernel.triton.gemv import gemv

        return gemv(x, weight, bias, gated, pdl=pdl)
    return F.linear(silu_and_mul(x) if gated else x, weight, bias)


class _Linear(nn.Module):
    """A weight ``[out, in]`` sharded along ``shard_dim`` by ``_place``, optionally FP8."""

    shard_dim = 0
    pdl = False  # launch the Triton kernels with PDL; set by the engine (``kernel/triton/pdl.py``)

    def _place(self, shard_id) -> tuple[int, int, int]:
        """(first row of this part in the local weight, first row in the checkpoint, rows)."""
        raise NotImplementedError

    def _init_weight(self, out: int, inp: int, quant: Fp8Config | None) -> None:
        self.quant = quant
        fp8 = quant is not None and not quant.online
        self.weight = new_param(out, inp, loader=self._load, dtype=FP8 if fp8 else None)
        self.weight_scale_inv = None
        if fp8:
            bn, bk = quant.block
            unit = quant.block[self.shard_dim]
            self.weight_scale_inv = new_param(-(-out // bn), -(-inp // bk), dtype=torch.float32,
                                              loader=functools.partial(self._load, unit=unit))

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id, unit: int = 1) -> None:
        dim = self.shard_dim if param.dim() == 2 else 0
        if (dim == 1 and param is self.weight and self.quant is not None and self.quant.channel
                and loaded.shape[1] != param.shape[1]):  # a shard of the rows: read them whole
            whole = loaded.load() if hasattr(loaded, "load") else loaded
            self._row_amax = whole.abs().amax(dim=1).float()
        copy_part(param, loaded, dim, *self._place(shard_id), unit=unit)

    @property
    def scale_block(self) -> tuple[int, int] | None:
        """The block of ``weight_scale_inv``; None: per-channel scales ``[N, 1]``."""
        return None if self.quant.channel else self.quant.block

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None, gated: bool = False,
                norm_eps: float | None = None, residual: torch.Tensor | None = None,
                act: bool = False) -> torch.Tensor:
        """``norm_eps``, ``residual`` and ``act``: see ``fp8_linear`` (FP8 layers only)."""
        if self.weight_scale_inv is not None:
            return fp8_linear(x, self.weight, self.weight_scale_inv, self.scale_block, bias, gated,
                              norm_eps, residual, act, pdl=self.pdl)
        assert norm_eps is None and residual is None and not act, \
            "a fused norm, add or activation needs an FP8 layer"
        return linear(x, self.weight, bias, gated, pdl=self.pdl)

    def quantize_weights_(self, input_scale: torch.Tensor | None = None) -> None:
        """``--quantization fp8``: replace the loaded weight by e4m3 and its per-channel (or block)
        scales. ``input_scale [K]``: multiplied into the weight's columns first, in fp32 (an
        RMSNorm weight folded into the layer it feeds, ``DecoderLayer.fold_norms_``). Once per
        layer: an e4m3 weight is left as it is."""
        if self.quant is None or not self.quant.online or self.weight.dtype == FP8:
            return
        w = self.weight.data
        if input_scale is not None:
            w = w.float() * input_scale.float()
        if self.quant.channel:
            amax = getattr(self, "_row_amax", None)
            amax = None if amax is None else amax.to(self.weight.device)
            assert amax is None or input_scale is None, "a row-parallel shard is never folded into"
            q, s = quantize_channel(w, amax)
            self._row_amax = None
        else:
            q, s = quantize_block(w, self.quant.block)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(s, requires_grad=False)


class LinearQKVMerged(_Linear):
    """q, k and v projections in one GEMM; each rank holds its query heads and its KV heads.

    When there are fewer KV heads than ranks, KV heads are replicated: rank r uses KV head
    ``r * num_kv_heads // tp``.
    """

    def __init__(self, hidden: int, head_dim: int, num_qo: int, num_kv: int, bias: bool,
                 tp: DistributedInfo, quant: Fp8Config | None = None) -> None:
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
                 quant: Fp8Config | None = None):
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

    def __init__(self, in_features: int, out_features: int, bias: bool, comm: DistributedCommunicator,
                 quant: Fp8Config | None = None):
        super().__init__()
        self.comm, tp = comm, comm.info
        self.local_in = divide(in_features, tp.size, "row-parallel input")
        self._init_weight(out_features, self.local_in, quant)
        # NOTE: the bias is added after the all-reduce, so it is counted once, not tp times.
        self.bias = new_param(out_features) if bias else None

    def _place(self, shard_id: None) -> tuple[int, int, int]:
        return 0, self.comm.info.rank * self.local_in, self.local_in

    def forward(self, x: torch.Tensor, gated: bool = False,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """``gated``: x is ``[gate | up]`` of twice the input width; the input is silu(gate) * up.
        ``residual``: added to the output inside the FP8 layer's kernel (one rank only)."""
        assert residual is None or self.comm.info.size == 1, "the fused residual add is TP=1's"
        y = self.comm.all_reduce(self._matmul(x, gated=gated, residual=residual))
        return y if self.bias is None else y + self.bias


class ReplicatedLinear(nn.Module):
    """A small linear layer every rank holds whole (the MoE router; never quantized, as in the
    published FP8 checkpoints)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = new_param(out_features, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)
