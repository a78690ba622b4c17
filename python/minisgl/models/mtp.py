"""The multi-token-prediction head of Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoints (``mtp.``), the
draft model of the ``mtp`` speculative method (``speculative/mtp.py``).

Given the target's last hidden state at position p (after its final norm) and the token at
p + 1, it predicts the token at p + 2::

    x = fc([pre_fc_norm_embedding(embed(token[p + 1])) | pre_fc_norm_hidden(hidden[p])])
    x = decoder layer (gated full attention, causal over the head's own KV; dense MLP or MoE)
    out = norm(x)  ->  the target's LM head  ->  logits of token p + 2

The embedding and the LM head are the target's. Drafting k tokens chains it: ``out`` at one
position is the hidden input of the next. The attention keeps its own K/V per request (the
proposer holds them, ``speculative/mtp.py``), so ``forward`` takes the past K/V and returns the new.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.layers import GatedMLP, RMSNorm
from minisgl.moe import BaseMoeBackend

from .config import ModelConfig
from .hybrid_layers import SharedExpertMoE, gated_attention


class MTPLayer(nn.Module):
    """The head's decoder layer: the target's layer layout (``hybrid.HybridDecoderLayer``) with
    full attention over K/V it is handed."""

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator,
                 moe: BaseMoeBackend) -> None:
        super().__init__()
        self.self_attn = gated_attention(cfg, 0, 0, comm)
        if cfg.num_experts:
            self.mlp = SharedExpertMoE(cfg, cfg.hybrid.shared_expert_intermediate_size, comm, moe)
        else:
            self.mlp = GatedMLP.from_config(cfg, comm)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset=1.0)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, past_k: torch.Tensor,
                past_v: torch.Tensor):
        """x ``[T, H]`` at ``positions`` (increasing, after every past one); past K/V
        ``[P, Hkv, D]``. Returns (x, residual, k, v): the new rows' K/V ``[T, Hkv, D]``."""
        attn = self.self_attn
        h, residual = self.input_layernorm.add_norm(x, None)
        q, k, v, gate = attn.project(h, positions)
        keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
        t, p = x.shape[0], past_k.shape[0]
        mask = torch.ones(t, p + t, dtype=torch.bool, device=x.device)
        mask[:, p:] = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        rep = q.shape[1] // keys.shape[1]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), keys.repeat_interleave(rep, 1).transpose(0, 1),
            values.repeat_interleave(rep, 1).transpose(0, 1), attn_mask=mask,
            scale=attn.head_dim ** -0.5)
        out = out.transpose(0, 1).reshape(t, -1) * torch.sigmoid(gate)
        h, residual = self.post_attention_layernorm.add_norm(attn.o_proj(out), residual)
        return self.mlp(h), residual, k, v


class MTPHead(nn.Module):
    """``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.0``,
    ``mtp.norm`` (only one layer: ``mtp_num_hidden_layers: 1`` in every released checkpoint)."""

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator,
                 moe: BaseMoeBackend) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(h, cfg.rms_norm_eps, offset=1.0)
        self.pre_fc_norm_hidden = RMSNorm(h, cfg.rms_norm_eps, offset=1.0)
        self.layers = nn.ModuleList([MTPLayer(cfg, comm, moe)])
        self.norm = RMSNorm(h, cfg.rms_norm_eps, offset=1.0)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                past_k: torch.Tensor, past_v: torch.Tensor):
        """``embeds``: the target's embedding of the tokens at p + 1; ``hidden``: the target's
        (or the previous draft step's) hidden state at p. Returns (the head's output ``[T, H]``,
        for the LM head and the next step, and the new K/V)."""
        x = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], -1)
        x, residual, k, v = self.layers[0](self.fc(x), positions, past_k, past_v)
        return self.norm.add_norm(x, residual)[0], k, v
