"""The multi-token-prediction head of Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoints (``mtp.``), the
draft model of the ``mtp`` speculative method (``speculative/mtp.py``).

Given the target's last hidden state at position p (after its final norm) and the token at
p + 1, it predicts the token at p + 2::

    x = fc([pre_fc_norm_embedding(embed(token[p + 1])) | pre_fc_norm_hidden(hidden[p])])
    x = decoder layer (gated full attention, causal over the head's own KV; dense MLP or MoE)
    out = norm(x)  ->  the target's LM head  ->  logits of token p + 2

The embedding and the LM head are the target's. Drafting k tokens chains it: ``out`` at one
position is the hidden input of the next. The attention is a KV layer of the engine's paged pool
after the target's (``kv_layer``, the model's ``CacheSpec.draft``), addressed through the
requests' page-table rows and attended by the engine's backend, in a batch the proposer builds
(``speculative/head.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import GatedMLP, RMSNorm
from minisgl.moe import BaseMoeBackend

from .config import ModelConfig
from .hybrid_layers import SharedExpertMoE, gated_attention

if TYPE_CHECKING:
    from minisgl.context import Context


class MTPLayer(nn.Module):
    """The head's decoder layer: the target's layer layout (``hybrid.HybridDecoderLayer``) with
    gated full attention on KV layer ``kv_layer``."""

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator, moe: BaseMoeBackend,
                 kv_layer: int) -> None:
        super().__init__()
        self.self_attn = gated_attention(cfg, 0, kv_layer, comm)
        if cfg.num_experts:
            self.mlp = SharedExpertMoE(cfg, cfg.hybrid.shared_expert_intermediate_size, comm, moe)
        else:
            self.mlp = GatedMLP.from_config(cfg, comm)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: Context
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[T, H]`` at ``positions``, the batch bound to ``ctx``. Returns (x, residual)."""
        h, residual = self.input_layernorm.add_norm(x, None)
        h, residual = self.post_attention_layernorm.add_norm(self.self_attn(h, positions, ctx),
                                                             residual)
        return self.mlp(h), residual


class MTPHead(nn.Module):
    """``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.0``,
    ``mtp.norm`` (only one layer: ``mtp_num_hidden_layers: 1`` in every released checkpoint)."""

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator, moe: BaseMoeBackend,
                 kv_layer: int) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, cfg.rms_norm_eps, offset=1.0)
        self.pre_fc_norm_hidden = RMSNorm(h, cfg.rms_norm_eps, offset=1.0)
        self.layers = nn.ModuleList([MTPLayer(cfg, comm, moe, kv_layer)])
        self.norm = RMSNorm(h, cfg.rms_norm_eps, offset=1.0)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                ctx: Context) -> torch.Tensor:
        """``embeds``: the target's embedding of the tokens at p + 1; ``hidden``: the target's
        (or the previous draft step's) hidden state at p. Stores the K/V at the bound batch's
        ``out_loc``; returns the head's output ``[T, H]``, for the LM head and the next step."""
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        x, residual = self.layers[0](self.fc(x), positions, ctx)
        return self.norm.add_norm(x, residual)[0]
