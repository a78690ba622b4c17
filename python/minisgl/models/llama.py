"""Llama (incl. Llama-3 RoPE scaling; Mistral's checkpoints too, ``registry.py``), and the
Llama-style decoder layer the Qwen families reuse: pre-norm attention and gated-SiLU MLP with
fused residual adds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import AttentionLayer, GatedMLP, RMSNorm
from minisgl.layers.fusion import NormFusion, fuse_norms
from minisgl.moe import BaseMoeBackend

from .base import BaseLLMModel
from .config import ModelConfig

if TYPE_CHECKING:
    from minisgl.context import Context


class LlamaDecoderLayer(nn.Module):
    """``attn``: the layer's attention, when not the config's plain one (gpt-oss: sinks, a
    window)."""

    def __init__(
        self, cfg: ModelConfig, layer_id: int, comm: DistributedCommunicator, mlp: nn.Module,
        attn: AttentionLayer | None = None,
    ) -> None:
        super().__init__()
        self.self_attn = attn if attn is not None else AttentionLayer(cfg, layer_id, comm)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.tp_size = comm.info.size
        self.fusion = NormFusion()

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, ctx: Context
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.fusion.one_token and x.shape[0] == 1 and x.is_cuda:
            return self._forward_one_token(x, residual, positions, ctx)
        # the projections after the norms quantize their input per token: the norms do it instead
        quant = self.fusion.quantized_inputs and x.is_cuda and x.shape[0] > 1
        x, residual = self.input_layernorm.add_norm(x, residual, quant)
        x = self.self_attn(x, positions, ctx)
        x, residual = self.post_attention_layernorm.add_norm(x, residual, quant)
        return self.mlp(x), residual

    def _forward_one_token(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, ctx: Context
    ) -> tuple[torch.Tensor, None]:
        """One token, norms folded: the QKV and gate-up GEMVs normalise the residual stream as
        they read it, the o and down GEMVs add it as they write, so the layer runs no norm kernel
        and returns the stream itself (residual None). The gate-up GEMV writes
        ``silu(gate) * up``, so the down GEMV reads a plain input of half the width."""
        if residual is not None:
            x = x + residual
        eps = self.input_layernorm.eps
        h = self.self_attn(x, positions, ctx, norm_eps=eps, residual=x)
        act = self.mlp.gate_up_proj(h, norm_eps=self.post_attention_layernorm.eps, act=True)
        return self.mlp.down_proj(act, residual=h), None

    def fuse_norms(self) -> None:
        """After loading: fold the norms into the projections they feed where the linear methods
        offer it (``layers.fusion``); every other path runs the norm kernels with unit weights."""
        attn, mlp_in = self.self_attn, self.mlp.input_linear
        projections = [attn.qkv_proj, attn.o_proj]
        if mlp_in is not None:
            projections += [mlp_in, self.mlp.down_proj]
        self.fusion = fuse_norms(((self.input_layernorm, attn.qkv_proj),
                                  (self.post_attention_layernorm, mlp_in)),
                                 projections, self.tp_size)


class LlamaForCausalLM(BaseLLMModel):
    def make_layer(self, cfg: ModelConfig, layer_id: int, comm: DistributedCommunicator,
                   moe: BaseMoeBackend) -> nn.Module:
        return LlamaDecoderLayer(cfg, layer_id, comm, GatedMLP.from_config(cfg, comm))

