"""The CUDA backend: decode rows through the in-place Triton kernels
(``kernel/triton/gated_delta.py``: conv window step, fused gating + L2 norm + delta rule), prefill
chunks through the varlen conv kernel and flash-linear-attention's chunked delta rule (``fla-core``,
``pip install 'minisgl[hybrid]'``), whose states are gathered from the chunks' slots and written
back (a prefill chunk moves its state once; a decode row moves nothing but its own slot).
Requests verifying drafts (speculative decoding) run the decode rule position by position inside
one program per request, each position's state into its draft slot
(``kernel/triton/gated_delta_verify.py``)."""

from __future__ import annotations

import torch

from minisgl.kernel.autotune_choices import seed_shipped
from minisgl.kernel.triton.gated_delta import conv_decode, conv_varlen, gdn_decode
from minisgl.kernel.triton.gated_delta_verify import conv_verify, gdn_verify

from .base import BaseLinearAttnBackend
from .fla_import import chunk_gated_delta_rule


def _chunk_rule():
    try:
        rule = chunk_gated_delta_rule()  # without fla's package __init__s (``fla_import``)
    except ImportError as e:
        raise ImportError("hybrid (Gated DeltaNet) models on CUDA need flash-linear-attention: "
                          "pip install 'minisgl[hybrid]' (the fla-core package)") from e
    if torch.cuda.is_available():  # its kernels autotune: this GPU's shipped choices, if any
        seed_shipped("fla", torch.cuda.get_device_name())
    return rule


class TritonLinearAttnBackend(BaseLinearAttnBackend):
    supports_cuda_graph = True

    def __init__(self, state_pool) -> None:
        super().__init__(state_pool)
        self.chunk_rule = _chunk_rule()

    def forward(self, layer, qkv, a, b, batch, out=None):
        meta = batch.state_metadata
        conv_state, ssm_state = self.state_pool.layer(layer.state_index)
        if out is None:
            out = qkv.new_empty(qkv.shape[0], layer.num_v_heads, layer.v_dim)
        weight, scale = layer.conv_weight, layer.k_dim ** -0.5
        d, n = meta.num_decode, meta.num_tokens
        if d:
            slots = meta.slots[:d]
            mixed = conv_decode(qkv[:d], weight, conv_state, slots)
            gdn_decode(mixed, a[:d], b[:d], layer.A_log, layer.dt_bias, ssm_state, slots,
                       layer.num_k_heads, layer.k_dim, scale, out=out[:d])
        if meta.verify is not None:
            v, end = meta.verify, d + meta.verify.num_tokens
            mixed = conv_verify(qkv[d:end], weight, conv_state, v.starts, v.lengths, v.slots,
                                v.drafts)
            out[d:end] = gdn_verify(mixed, a[d:end], b[d:end], layer.A_log, layer.dt_bias,
                                    ssm_state, v.starts, v.lengths, v.slots, v.drafts,
                                    layer.num_k_heads, layer.k_dim, scale)
        if meta.chunks is not None:
            c = meta.chunk_start
            out[c:n] = self._chunks(layer, qkv[c:n], a[c:n], b[c:n], meta.chunks, weight, scale,
                                    conv_state, ssm_state)
        if n < out.shape[0]:
            out[n:].zero_()
        return out

    def _chunks(self, layer, qkv, a, b, chunks, weight, scale, conv_state, ssm_state):
        mixed = conv_varlen(qkv, weight, conv_state, chunks.slots, chunks.cu_dev,
                            chunks.token_seq, chunks.has_init)
        tokens = mixed.shape[0]
        q, k, v = (t.reshape(1, tokens, -1, d).contiguous() for t, d in zip(
            mixed.split([layer.key_size, layer.key_size, layer.value_size], dim=-1),
            (layer.k_dim, layer.k_dim, layer.v_dim)))
        slots = chunks.slots.long()
        init = ssm_state[slots].float() * chunks.has_init[:, None, None, None]
        cu_dev, cu_cpu = chunks.cu_long
        # the q/k L2 norm and the decay's gating run inside fla's kernels; beta is sigmoid(b) in
        # the activation dtype, as the reference rounds it
        o, final = self.chunk_rule(q, k, v, g=a.contiguous()[None], beta=b.sigmoid()[None],
                                   scale=scale, initial_state=init, output_final_state=True,
                                   cu_seqlens=cu_dev, cu_seqlens_cpu=cu_cpu,
                                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                   A_log=layer.A_log, dt_bias=layer.dt_bias)
        ssm_state.index_copy_(0, slots, final.to(ssm_state.dtype))
        return o[0]
