"""The gated full attention of hybrid decoders (Qwen3-Next, Qwen3.5, Qwen3.6) and its norms; the
linear attention between these layers is ``linear_attention.py``.

Norm convention: every RMSNorm of these checkpoints but the gated one scales by ``1 + weight``
(weights are stored centred on zero), computed in fp32 and cast once, as the reference does.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.attention.spec import AttentionSpec
from minisgl.distributed import DistributedCommunicator
from minisgl.utils.fake import faking

from .base import divide, new_param
from .linear import LinearQKVMerged, LinearRowParallel
from .rotary import _inv_freq

if TYPE_CHECKING:
    from minisgl.context import Context
    from minisgl.models.config import ModelConfig, RotaryConfig


class OffsetRMSNorm(nn.Module):
    """``norm(x) * (1 + weight)``; with a residual, ``(norm(x + r) * (1 + w), x + r)``."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = new_param(size)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.is_cuda:  # one Triton pass (``kernel/triton/norm.py``)
            from minisgl.kernel.triton import norm

            if residual is not None:
                return norm.fused_add_rms_norm(x, residual, self.weight, self.eps, offset=True)
            out = norm.rms_norm(x, self.weight, self.eps, offset=True)
            return out if not self.fused else (out, x)
        if residual is not None:
            x = x + residual
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        out = (out * (1.0 + self.weight.float())).to(x.dtype)
        return out if residual is None and not self.fused else (out, x)

    fused = False


class FusedOffsetRMSNorm(OffsetRMSNorm):
    fused = True


def _cos_sin(cfg: RotaryConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    return _cos_sin_cached(cfg, device, faking())  # a shadow run's fakes apart (utils/fake.py)


@lru_cache(maxsize=8)
def _cos_sin_cached(cfg: RotaryConfig, device: torch.device,
                    fake: bool) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.outer(torch.arange(cfg.max_position, dtype=torch.float32), _inv_freq(cfg))
    return freqs.cos().to(device), freqs.sin().to(device)


def partial_rope(x: torch.Tensor, positions: torch.Tensor, cfg: RotaryConfig) -> torch.Tensor:
    """Neox-style RoPE on the first ``cfg.head_dim`` dims of each head, the rest passed through.

    Text positions only: the checkpoints' mRoPE sections (t, h, w) all see the same position for
    text, so every frequency rotates by the token's position and mRoPE is plain RoPE."""
    cos, sin = _cos_sin(cfg, x.device)
    cos, sin = cos[positions][:, None].to(x.dtype), sin[positions][:, None].to(x.dtype)
    rot, rest = x[..., : cfg.head_dim], x[..., cfg.head_dim:]
    x1, x2 = rot.chunk(2, dim=-1)
    rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([rot, rest], dim=-1)


class GatedAttention(nn.Module):
    """Full attention with an output gate: q_proj gives each head's query and gate side by side;
    q/k get (1 + w) RMSNorm and partial RoPE; the output is ``o_proj(attn * sigmoid(gate))``.

    ``kv_layer``: this layer's index among the full-attention layers (the KV pool holds only them).
    """

    def __init__(self, cfg: ModelConfig, rotary: RotaryConfig, kv_layer: int,
                 comm: DistributedCommunicator) -> None:
        super().__init__()
        self.kv_layer, self.head_dim, self.rotary = kv_layer, cfg.head_dim, rotary
        divide(cfg.num_qo_heads, comm.info.size, "num_attention_heads")
        # each head's [query | gate] rows are adjacent: 2 * heads rows of head_dim, split evenly
        self.qkv_proj = LinearQKVMerged(cfg.hidden_size, cfg.head_dim, 2 * cfg.num_qo_heads,
                                        cfg.num_kv_heads, cfg.attention_bias, comm.info,
                                        cfg.quant)
        self.local_qo = self.qkv_proj.local_qo // 2
        self.o_proj = LinearRowParallel(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, False,
                                        comm, cfg.quant)
        self.q_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.spec = AttentionSpec(kv_layer, self.local_qo, self.qkv_proj.local_kv, cfg.head_dim,
                                  cfg.head_dim**-0.5, rotary=rotary)

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """(q ``[T, H, D]``, k, v ``[T, Hkv, D]`` normed and rotated, gate ``[T, H * D]``): what
        the attention takes (the MTP head, ``models/mtp.py``, attends over its own KV)."""
        proj = self.qkv_proj
        q_gate, k, v = proj(x).split([proj.q_size, proj.kv_size, proj.kv_size], dim=-1)
        q, gate = q_gate.view(-1, self.local_qo, 2 * self.head_dim).chunk(2, dim=-1)
        gate = gate.reshape(x.shape[0], -1)
        k = k.view(-1, proj.local_kv, self.head_dim)
        if x.is_cuda:  # norms and RoPE in one launch
            from minisgl.kernel.triton.partial_rope import qk_norm_partial_rope

            cos, sin = _cos_sin(self.rotary, x.device)
            q, k = qk_norm_partial_rope(q, k, positions, cos, sin, self.q_norm.weight,
                                        self.k_norm.weight, self.q_norm.eps)
        else:
            q = partial_rope(self.q_norm(q), positions, self.rotary).contiguous()
            k = partial_rope(self.k_norm(k), positions, self.rotary).contiguous()
        v = v.reshape(-1, proj.local_kv, self.head_dim).contiguous()
        return q, k, v, gate

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        q, k, v, gate = self.project(x, positions)
        ctx.kv_pool.store_kv(k, v, ctx.batch.out_loc, self.kv_layer)
        out = ctx.attn_backend.forward(q, k, v, self.spec, ctx.batch)
        out = out.reshape(x.shape[0], -1) * torch.sigmoid(gate)
        return self.o_proj(out)
