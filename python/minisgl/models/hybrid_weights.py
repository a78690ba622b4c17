"""The checkpoint layout of hybrid models beyond name mapping: the tensors a checkpoint of a config
holds (for ``--dummy-weights``) and experts stored fused, split per expert for the loader."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Iterator

import torch

if TYPE_CHECKING:
    from .config import ModelConfig

_FUSED_EXPERTS = re.compile(r"(.*)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def checkpoint_shapes(cfg: ModelConfig, prefix: str, linear_shapes: Callable
                      ) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Names and full shapes of a checkpoint of ``cfg``; ``linear_shapes(h, hk, hv, dk, dv)``
    names the family's Gated DeltaNet input projections."""
    h, p = cfg.hidden_size, prefix
    yield p + "embed_tokens.weight", (cfg.vocab_size, h)
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", (cfg.vocab_size, h)
    yield p + "norm.weight", (h,)
    for i, kind in enumerate(cfg.hybrid.layer_types):
        yield from _layer_shapes(cfg, p + f"layers.{i}.", kind, cfg.is_sparse_layer(i),
                                 linear_shapes)
    if cfg.hybrid.mtp_layers:  # the MTP head (``models/mtp.py``): loaded for ``mtp`` only
        yield "mtp.fc.weight", (h, 2 * h)
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            yield f"mtp.{norm}.weight", (h,)
        yield from _layer_shapes(cfg, "mtp.layers.0.", "full_attention", cfg.num_experts > 0,
                                 linear_shapes)


def _layer_shapes(cfg: ModelConfig, q: str, kind: str, sparse: bool, linear_shapes: Callable
                  ) -> Iterator[tuple[str, tuple[int, ...]]]:
    """One decoder layer's tensors (its names start with ``q``)."""
    h, d, lin = cfg.hidden_size, cfg.head_dim, cfg.hybrid.linear
    hk, hv, dk, dv = lin.num_key_heads, lin.num_value_heads, lin.key_head_dim, lin.value_head_dim
    w = lin.conv_kernel
    yield q + "input_layernorm.weight", (h,)
    yield q + "post_attention_layernorm.weight", (h,)
    if kind == "full_attention":
        a = q + "self_attn."
        yield a + "q_proj.weight", (2 * cfg.num_qo_heads * d, h)
        yield a + "k_proj.weight", (cfg.num_kv_heads * d, h)
        yield a + "v_proj.weight", (cfg.num_kv_heads * d, h)
        yield a + "o_proj.weight", (h, cfg.num_qo_heads * d)
        yield a + "q_norm.weight", (d,)
        yield a + "k_norm.weight", (d,)
    else:
        a = q + "linear_attn."
        yield from ((a + n, s) for n, s in linear_shapes(h, hk, hv, dk, dv))
        yield a + "conv1d.weight", (2 * hk * dk + hv * dv, 1, w)
        yield a + "dt_bias", (hv,)
        yield a + "A_log", (hv,)
        yield a + "norm.weight", (dv,)
        yield a + "out_proj.weight", (h, hv * dv)
    m = q + "mlp."
    if sparse:
        inter = cfg.moe_intermediate_size
        shared = cfg.hybrid.shared_expert_intermediate_size
        yield m + "gate.weight", (cfg.num_experts, h)
        for e in range(cfg.num_experts):
            yield m + f"experts.{e}.gate_proj.weight", (inter, h)
            yield m + f"experts.{e}.up_proj.weight", (inter, h)
            yield m + f"experts.{e}.down_proj.weight", (h, inter)
        yield m + "shared_expert.gate_proj.weight", (shared, h)
        yield m + "shared_expert.up_proj.weight", (shared, h)
        yield m + "shared_expert.down_proj.weight", (h, shared)
        yield m + "shared_expert_gate.weight", (1, h)
    else:
        yield m + "gate_proj.weight", (cfg.intermediate_size, h)
        yield m + "up_proj.weight", (cfg.intermediate_size, h)
        yield m + "down_proj.weight", (h, cfg.intermediate_size)


def unfuse_experts(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Experts stored as one ``[E, ...]`` tensor (``experts.gate_up_proj``: ``[E, 2I, H]``,
    ``experts.down_proj``: ``[E, H, I]``) become the per-expert tensors the loader maps."""
    match = _FUSED_EXPERTS.search(name)
    if not match:
        yield name, tensor
        return
    full = tensor.load() if hasattr(tensor, "load") else tensor
    prefix = match.group(1)
    for e in range(full.shape[0]):
        if match.group(2) == "down_proj":
            yield f"{prefix}.mlp.experts.{e}.down_proj.weight", full[e]
        else:
            gate, up = full[e].chunk(2, dim=0)
            yield f"{prefix}.mlp.experts.{e}.gate_proj.weight", gate
            yield f"{prefix}.mlp.experts.{e}.up_proj.weight", up
