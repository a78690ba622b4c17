"""The Gated DeltaNet token mixer on CUDA: flash-linear-attention's (``fla-core``) Triton kernels
for the delta rule, over states gathered from and scattered back to the state pool.

``fla`` is imported here, lazily: install it with ``pip install 'minisgl[hybrid]'``. The torch
code in ``layers/gated_delta.py`` is the reference these paths are tested against (GPU tests).

A decode batch (one token onto an existing state per request) runs the fused recurrent kernel
and a batched conv step; anything else (prefill chunks, mixed steps) runs the chunked kernel
over the whole batch as variable-length sequences (decode rows are sequences of one), after the
causal conv of each request.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from minisgl.layers import gated_delta as ops


def _fla():
    try:
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule,
            fused_recurrent_gated_delta_rule,
        )
    except ImportError as e:
        raise ImportError("hybrid (Gated DeltaNet) models on CUDA need flash-linear-attention: "
                          "pip install 'minisgl[hybrid]' (the fla-core package)") from e
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def conv_step(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
              slots: torch.Tensor) -> torch.Tensor:
    """One new input per request: x ``[B, C]``; the window is the slot's ``W - 1`` inputs and x.
    Writes the shifted window back."""
    window = torch.cat([conv_state[slots], x[:, :, None].to(conv_state.dtype)], dim=-1)
    conv_state[slots] = window[:, :, 1:]
    out = (window.float() * weight.float()[None]).sum(-1)
    return F.silu(out).to(x.dtype)


def gated_delta_net_cuda(layer: Any, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         conv_state: torch.Tensor, ssm_state: torch.Tensor,
                         meta: Any) -> torch.Tensor:
    """``layer``: the ``GatedDeltaNet``; ``meta``: its batch's ``StateMetadata``."""
    chunk_rule, recurrent_rule = _fla()
    weight, slots = layer.conv1d_weight[:, 0], meta.slots_dev
    if meta.all_single_continuing:
        mixed = conv_step(qkv, weight, conv_state, slots)
    else:
        fresh = [s for s, f in zip(meta.slots, meta.fresh) if f]
        if fresh:
            zero = torch.tensor(fresh, device=qkv.device)
            conv_state[zero] = 0
            ssm_state[zero] = 0
        parts = []
        for i, slot in enumerate(meta.slots):
            lo, hi = meta.cu_seqlens[i], meta.cu_seqlens[i + 1]
            out, conv_state[slot] = ops.causal_conv1d(qkv[lo:hi], weight, None, conv_state[slot])
            parts.append(out)
        mixed = torch.cat(parts)
    q, k, v = layer._split_heads(mixed)
    q, k, v = (t.to(qkv.dtype)[None] for t in (q, k, v))
    state = ssm_state[slots]
    cu = torch.tensor(meta.cu_seqlens, dtype=torch.int64).to(qkv.device, non_blocking=True)
    rule = recurrent_rule if meta.all_single_continuing else chunk_rule
    out, state = rule(q, k, v, g=g[None], beta=beta[None].to(qkv.dtype),
                      scale=layer.k_dim ** -0.5, initial_state=state, output_final_state=True,
                      cu_seqlens=cu)
    ssm_state[slots] = state.float()
    return out[0].to(qkv.dtype)
