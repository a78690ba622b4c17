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
        verify = range(meta.num_decode, meta.num_decode + meta.num_verify)
        for i, slot in enumerate(meta.slot_list):
            lo, hi = meta.cu_seqlens[i], meta.cu_seqlens[i + 1]
            if meta.fresh[i]:
                conv_state[slot].zero_()
                ssm_state[slot].zero_()
            # a verifying request: one position at a time, each state into its draft slot
            steps = [(lo, hi, slot, slot)]
            if i in verify:
                first = meta.draft_slots[i - verify.start]
                steps = [(t, t + 1, first + j - 1 if j else slot, first + j)
                         for j, t in enumerate(range(lo, hi))]
            for start, end, src, dst in steps:
                mixed, conv_state[dst] = ops.causal_conv1d(qkv[start:end], weight, None,
                                                           conv_state[src])
                q, k, v = layer.split_heads(mixed)
                rule = (ops.recurrent_gated_delta_rule if end - start == 1
                        else ops.chunk_gated_delta_rule)
                o, state = rule(q, k, v, g[start:end], beta[start:end], ssm_state[src], scale)
                ssm_state[dst] = state.to(ssm_state.dtype)
                out[start:end] = o.to(out.dtype)
        out[meta.cu_seqlens[-1]:].zero_()
        return out
