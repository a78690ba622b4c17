"""The decoder-only LM every supported architecture is built from.

Llama, Mistral, Qwen2 and Qwen3 differ only in switches of ``ModelConfig`` (QKV bias, q/k norm,
RoPE scaling); Qwen3-MoE swaps the MLP of sparse layers for ``MoELayer``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable

import torch
from torch import nn

from minisgl import env
from minisgl.distributed import DistributedCommunicator
from minisgl.layers.base import copy_weight
from minisgl.layers import (
    AttentionLayer,
    LinearColParallelMerged,
    LinearRowParallel,
    MoELayer,
    ParallelLMHead,
    RMSNormFused,
    VocabParallelEmbedding,
)
from minisgl.moe import BaseMoeBackend
from minisgl.quant.linear import takes_quantized_input

from .config import ModelConfig

if TYPE_CHECKING:
    from minisgl.context import Context


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator) -> None:
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported (silu)")
        inter = cfg.intermediate_size
        self.gate_up_proj = LinearColParallelMerged(cfg.hidden_size, [inter, inter], False, comm.info,
                                                    cfg.quant)
        self.down_proj = LinearRowParallel(inter, cfg.hidden_size, False, comm, cfg.quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj(x), gated=True)


class DecoderLayer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer_id: int, comm: DistributedCommunicator, moe: BaseMoeBackend
    ) -> None:
        super().__init__()
        self.self_attn = AttentionLayer(cfg, layer_id, comm)
        self.mlp = (MoELayer(cfg, comm, moe, cfg.quant) if cfg.is_sparse_layer(layer_id)
                    else GatedMLP(cfg, comm))
        self.input_layernorm = RMSNormFused(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNormFused(cfg.hidden_size, cfg.rms_norm_eps)
        self.tp_size = comm.info.size
        self.norms_folded = False
        self.quantized_inputs = False  # fold_norms_: the norms quantize for QKV and gate-up

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, ctx: Context
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.norms_folded and x.shape[0] == 1 and x.is_cuda and self.tp_size == 1 \
                and env.NORM_GEMV.get() != "0":
            return self._forward_one_token(x, residual, positions, ctx)
        # the FP8 QKV and gate-up GEMMs quantize their input per token: the norms do it instead
        quant = self.quantized_inputs and x.is_cuda and x.shape[0] > 1 \
            and env.NORM_QUANT.get() != "0"
        x, residual = self.input_layernorm(x, residual, quant)
        x = self.self_attn(x, positions, ctx)
        x, residual = self.post_attention_layernorm(x, residual, quant)
        return self.mlp(x), residual

    def _forward_one_token(
        self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, ctx: Context
    ) -> tuple[torch.Tensor, None]:
        """One token, norms folded (``fold_norms_``): the QKV and gate-up GEMVs normalise the
        residual stream as they read it, the o and down GEMVs add it as they write, so the layer
        runs no norm kernel and returns the stream itself (residual None). The gate-up GEMV
        writes ``silu(gate) * up``, so the down GEMV reads a plain input of half the width."""
        if residual is not None:
            x = x + residual
        eps = self.input_layernorm.eps
        h = self.self_attn(x, positions, ctx, norm_eps=eps, residual=x)
        act = self.mlp.gate_up_proj(h, norm_eps=self.post_attention_layernorm.eps, act=True)
        return self.mlp.down_proj(act, residual=h), None

    def fold_norms_(self) -> None:
        """``--quantization fp8`` (per-channel): the two RMSNorms' weights are multiplied into the
        columns of the projections they feed (QKV; gate-up of a dense MLP) as those are quantized,
        and become ones: ``W @ (g * n) == (W * g) @ n``. One-token decode then needs no norm kernel
        (``_forward_one_token``); every other path runs the norm kernels with unit weights."""
        qkv = self.self_attn.qkv_proj
        quant = qkv.quant
        if (quant is None or not quant.online or not quant.channel
                or not isinstance(self.mlp, GatedMLP)):
            return
        pairs = ((self.input_layernorm, qkv),
                 (self.post_attention_layernorm, self.mlp.gate_up_proj))
        for norm, proj in pairs:
            proj.quantize_weights_(input_scale=norm.weight.data)
            norm.weight.data.fill_(1.0)
        self.norms_folded = True
        self.quantized_inputs = all(
            takes_quantized_input(p.weight, p.weight_scale_inv, p.scale_block, norm.weight.dtype)
            for norm, p in pairs)


# checkpoint name -> (our parameter name, shard id)
_MERGED = [
    (re.compile(r"(.*)\.self_attn\.([qkv])_proj\.(weight|bias|weight_scale_inv)$"),
     r"\1.self_attn.qkv_proj.\3", 2),
    (re.compile(r"(.*)\.mlp\.gate_proj\.(weight|weight_scale_inv)$"), r"\1.mlp.gate_up_proj.\2", 0),
    (re.compile(r"(.*)\.mlp\.up_proj\.(weight|weight_scale_inv)$"), r"\1.mlp.gate_up_proj.\2", 1),
]
_EXPERT = re.compile(r"(.*)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.(weight|weight_scale_inv)$")
# per-layer FP8 KV-cache scales (``layers.N.self_attn.k_scale``), kept for the KV pool
_KV_SCALE = re.compile(r"layers\.(\d+)\.self_attn\.(?:attn\.)?([kv])_scale$")


class BaseLLMModel(nn.Module):
    """``forward(input_ids, positions, ctx)`` returns the hidden states of every computed token;
    ``compute_logits`` projects only the rows that are sampled."""

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator, moe: BaseMoeBackend):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, comm)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, comm, moe) for i in range(cfg.num_layers)
        )
        self.norm = RMSNormFused(cfg.hidden_size, cfg.rms_norm_eps)
        tied = self.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, comm, tied=tied)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: Context) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, ctx)
        return self.norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def checkpoint_names(self, name: str) -> tuple[str, object] | None:
        """Map a Hugging Face tensor name to (our parameter, shard id); None to skip it."""
        name = name.removeprefix("model.")
        if name.startswith("lm_head.") and self.cfg.tie_word_embeddings:
            return None
        if "rotary_emb.inv_freq" in name:
            return None
        for pattern, target, shard in _MERGED:
            match = pattern.match(name)
            if match:
                shard_id = match.group(2) if shard == 2 else shard
                return match.expand(target), shard_id
        match = _EXPERT.match(name)
        if match:
            prefix, expert, kind = match.group(1), int(match.group(2)), match.group(3)
            suffix = "_scale_inv" if match.group(4) == "weight_scale_inv" else ""
            if kind == "down":
                return f"{prefix}.mlp.w2{suffix}", expert
            return f"{prefix}.mlp.w13{suffix}", (expert, 0 if kind == "gate" else 1)
        return name, None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load every tensor into its parameter; then quantize (``--quantization fp8``). Per-layer
        KV-cache scales land in ``self.kv_scales`` ({layer: {"k": s, "v": s}}) for the KV pool."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        self.kv_scales: dict[int, dict[str, float]] = {}
        for ckpt_name, tensor in weights:
            kv_scale = _KV_SCALE.search(ckpt_name)
            if kv_scale:
                value = tensor.load() if hasattr(tensor, "load") else tensor
                self.kv_scales.setdefault(int(kv_scale.group(1)), {})[kv_scale.group(2)] = \
                    float(value.float().reshape(-1)[0])
                continue
            mapped = self.checkpoint_names(ckpt_name)
            if mapped is None:
                continue
            name, shard_id = mapped
            if name not in params:
                raise ValueError(f"checkpoint tensor {ckpt_name!r} matches no parameter of the model")
            param = params[name]
            tensor = tensor.to(param.dtype)
            loader = getattr(param, "weight_loader", None)
            try:
                if loader is not None:
                    loader(param, tensor, shard_id)
                else:
                    copy_weight(param, tensor)
            except ValueError as e:
                raise ValueError(f"{ckpt_name}: {e}") from None
            loaded.add(name)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"checkpoint lacks weights for: {', '.join(sorted(missing)[:8])}")
        for layer in self.layers:
            layer.fold_norms_()
        for module in self.modules():
            if hasattr(module, "quantize_weights_"):
                module.quantize_weights_()

