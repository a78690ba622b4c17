"""The Gated DeltaNet layer of hybrid models (Qwen3-Next, Qwen3.5, Qwen3.6): projections, the
token mixer over the state pool (run by the linear-attention backend, ``minisgl/linear_attn``, on
the batch's ``StateMetadata``), gated RMSNorm and the output projection.

A request's state lives in its slot (its page-table row); a chunk that starts at position 0 starts
from zeros, any other continues from what the slot holds: the state after its last computed
token, left there by the previous chunk or decode step, or copied in from a prefix-cache snapshot.

Tensor parallelism splits value heads (and the key heads they group over) and the conv channels:
each rank holds the state of its heads, and the output projection is row-parallel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator

from . import gated_delta as ops
from .base import copy_part, divide, new_param
from .linear import LinearRowParallel, _Linear

if TYPE_CHECKING:
    from minisgl.context import Context
    from minisgl.models.config import LinearAttnConfig
    from minisgl.quant import QuantizationConfig


class SplitColumnLinear(_Linear):
    """A column-parallel projection whose output is ``parts`` laid end to end, each part split
    evenly over the ranks (q | k | v of the conv input: each rank keeps its heads of every part).

    A checkpoint tensor holds some consecutive parts; its shard id is their indices."""

    def __init__(self, in_features: int, parts: list[int], comm: DistributedCommunicator,
                 quant: QuantizationConfig | None = None,
                 what: str = "linear attention heads") -> None:
        super().__init__()
        self.tp = comm.info
        self.parts = parts
        self.local = [divide(n, self.tp.size, what) for n in parts]
        self._init_weight(sum(self.local), in_features, quant)
        self.bias = None

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id, unit: int = 1) -> None:
        self.method.on_load(self, param, loaded)
        load_parts(param, loaded, self.parts, self.local, tuple(shard_id), self.tp.rank, unit)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._matmul(x)


def load_parts(param: torch.Tensor, loaded: torch.Tensor, parts: list[int], local: list[int],
               ids: tuple[int, ...], rank: int, unit: int = 1) -> None:
    """Copy this rank's slice of each part ``ids`` of ``loaded`` (the parts end to end along dim
    0) into its place in ``param`` (the local slices end to end)."""
    src = 0
    for i in ids:
        dst = sum(local[:i])
        copy_part(param, loaded, 0, dst, src + rank * local[i], local[i], unit)
        src += parts[i]


class GatedDeltaNet(nn.Module):
    """Projections -> causal conv + SiLU -> L2-normalised q/k, decay and beta -> gated delta rule
    over the slot's state -> gated RMSNorm -> output projection.

    The subclass (per checkpoint family) builds ``in_proj*`` and implements ``project`` returning
    ``(qkv [T, conv_dim], z [T, Hv, Dv], b [T, Hv], a [T, Hv])`` for this rank."""

    def __init__(self, cfg: LinearAttnConfig, hidden_size: int, eps: float, state_index: int,
                 comm: DistributedCommunicator, quant: QuantizationConfig | None) -> None:
        super().__init__()
        tp = comm.info.size
        self.cfg, self.hidden_size, self.eps = cfg, hidden_size, eps
        self.state_index = state_index  # which linear layer of the state pool
        self.num_k_heads = divide(cfg.num_key_heads, tp, "linear_num_key_heads")
        self.num_v_heads = divide(cfg.num_value_heads, tp, "linear_num_value_heads")
        self.k_dim, self.v_dim = cfg.key_head_dim, cfg.value_head_dim
        self.key_size = self.num_k_heads * self.k_dim
        self.value_size = self.num_v_heads * self.v_dim
        self.conv_dim = 2 * self.key_size + self.value_size
        self.conv_width = cfg.conv_kernel
        total_k = cfg.num_key_heads * self.k_dim
        self.conv_parts = [total_k, total_k, cfg.value_size]
        local = [self.key_size, self.key_size, self.value_size]
        rank = comm.info.rank
        # [conv_dim, 1, W] as the checkpoint stores it (a depthwise Conv1d)
        self.conv1d_weight = new_param(self.conv_dim, 1, self.conv_width, loader=lambda p, t, _: (
            load_parts(p, t, self.conv_parts, local, (0, 1, 2), rank)))
        self.dt_bias = new_param(self.num_v_heads, loader=self._load_heads, dtype=torch.float32)
        self.A_log = new_param(self.num_v_heads, loader=self._load_heads, dtype=torch.float32)
        self.norm_weight = new_param(self.v_dim)
        self.out_proj = LinearRowParallel(cfg.value_size, hidden_size, False, comm, quant)
        self.rank = rank

    def _load_heads(self, param: nn.Parameter, loaded: torch.Tensor, _=None) -> None:
        copy_part(param, loaded, 0, 0, self.rank * self.num_v_heads, self.num_v_heads)

    def project(self, x: torch.Tensor):  # pragma: no cover - implemented per family
        raise NotImplementedError

    @property
    def conv_weight(self) -> torch.Tensor:
        """``[conv_dim, W]``: the depthwise conv's taps per channel."""
        return self.conv1d_weight[:, 0]

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        qkv, z, b, a = self.project(x)
        out = ctx.linear_attn.forward(self, qkv, a, b, ctx.batch)
        if out.is_cuda:
            from minisgl.kernel.triton.norm import gated_rms_norm

            out = gated_rms_norm(out, z, self.norm_weight, self.eps)
        else:
            out = ops.gated_rms_norm(out, z, self.norm_weight, self.eps)
        return self.out_proj(out.reshape(x.shape[0], -1))

    def split_heads(self, mixed: torch.Tensor):
        """The conv output's q, k (L2-normalised, fp32) and v heads."""
        q, k, v = mixed.split([self.key_size, self.key_size, self.value_size], dim=-1)
        return (ops.l2norm(q.reshape(-1, self.num_k_heads, self.k_dim)),
                ops.l2norm(k.reshape(-1, self.num_k_heads, self.k_dim)),
                v.reshape(-1, self.num_v_heads, self.v_dim))
