"""The reference backend: one request at a time, in plain torch (``layers/gated_delta.py``)."""

from __future__ import annotations

from minisgl.layers import gated_delta as ops

from .base import BaseLinearAttnBackend


class TorchLinearAttnBackend(BaseLinearAttnBackend):
    def forward(self, layer, qkv, a, b, batch, out=None):
        meta = batch.state_metadata
        conv_state, ssm_state = self.state_pool.layer(layer.state_index)
        if out is None:
            out = qkv.new_empty(qkv.shape[0], layer.num_v_heads, layer.v_dim)
        g, beta = ops.gdn_gating(a, b, layer.A_log, layer.dt_bias)
        weight, scale = layer.conv1d_weight[:, 0], layer.k_dim ** -0.5
        for i, slot in enumerate(meta.slot_list):
            lo, hi = meta.cu_seqlens[i], meta.cu_seqlens[i + 1]
            if meta.fresh[i]:
                conv_state[slot].zero_()
                ssm_state[slot].zero_()
            mixed, conv_state[slot] = ops.causal_conv1d(qkv[lo:hi], weight, None, conv_state[slot])
            q, k, v = layer.split_heads(mixed)
            rule = ops.recurrent_gated_delta_rule if hi - lo == 1 else ops.chunk_gated_delta_rule
            o, state = rule(q, k, v, g[lo:hi], beta[lo:hi], ssm_state[slot], scale)
            ssm_state[slot] = state.to(ssm_state.dtype)
            out[lo:hi] = o.to(out.dtype)
        out[meta.cu_seqlens[-1]:].zero_()
        return out
