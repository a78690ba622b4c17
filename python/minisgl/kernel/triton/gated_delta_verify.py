"""Gated DeltaNet kernels for speculative decoding's verify rows: each request feeds k + 1 tokens
that must leave the state after every one of them (a rejection resumes from the accepted one),
so they run the decode rule token by token inside one program and store each position's state
in that request's draft slots (``kvcache/state_pool.py``), never in its own slot.

Per verifying request ``i``: its tokens ``starts[i] .. starts[i] + lengths[i] - 1`` (rows of the
inputs handed in), the slot it continues from (``slots[i]``: its own) and its first draft slot
(``drafts[i]``: position j's state goes to ``drafts[i] + j``). Layouts and the arithmetic are
those of ``gated_delta.py`` (its decode kernels are the one-token case); two launches per layer
whatever k, and the delta-rule state is read once per request, not once per position.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gated_delta import _conv_step, _delta_step


@triton.jit(do_not_specialize_on_alignment=["starts_ptr", "lengths_ptr", "slots_ptr",
                                            "drafts_ptr"])
def _conv_verify_kernel(x_ptr, w_ptr, state_ptr, starts_ptr, lengths_ptr, slots_ptr, drafts_ptr,
                        out_ptr, C, stride_x, stride_slot, stride_out, W: tl.constexpr,
                        WP: tl.constexpr, BLOCK_C: tl.constexpr):
    """Request ``i`` over ``BLOCK_C`` channels: position j reads the window of position j - 1
    (its own slot for j = 0), and writes the shifted window to draft slot j."""
    i = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    start = tl.load(starts_ptr + i)
    length = tl.load(lengths_ptr + i)
    src = tl.load(slots_ptr + i).to(tl.int64)
    first = tl.load(drafts_ptr + i).to(tl.int64)
    j = tl.arange(0, WP)
    w = tl.load(w_ptr + c[:, None] * W + j[None, :], mask=cm[:, None] & (j[None, :] < W - 1),
                other=0.0)
    w_last = tl.load(w_ptr + c * W + (W - 1), mask=cm, other=0.0).to(tl.float32)
    for t in range(0, length):
        row = (start + t).to(tl.int64)
        x = tl.load(x_ptr + row * stride_x + c, mask=cm, other=0.0)
        dst = first + t
        out = _conv_step(state_ptr + src * stride_slot + c[:, None] * (W - 1),
                         state_ptr + dst * stride_slot + c[:, None] * (W - 1), x, w, w_last, cm,
                         W, WP)
        tl.store(out_ptr + row * stride_out + c, out, mask=cm)
        # the next position reads what this one wrote (other threads' elements)
        tl.debug_barrier()
        src = dst


def conv_verify(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                starts: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor,
                drafts: torch.Tensor) -> torch.Tensor:
    """x ``[T, C]`` (the verifying requests' rows), weight ``[C, W]``; per request its rows,
    slot and first draft slot (int32). Returns ``silu(conv)`` ``[T, C]`` in x's dtype."""
    channels, width = x.shape[1], weight.shape[-1]
    out = torch.empty_like(x)
    block = 256
    if slots.shape[0]:
        _conv_verify_kernel[(slots.shape[0], triton.cdiv(channels, block))](
            x, weight, conv_state, starts, lengths, slots, drafts, out, channels, x.stride(0),
            conv_state.stride(0), out.stride(0), W=width, WP=triton.next_power_of_2(width),
            BLOCK_C=block)
    return out


@triton.jit(do_not_specialize_on_alignment=["starts_ptr", "lengths_ptr", "slots_ptr",
                                            "drafts_ptr"])
def _gdn_verify_kernel(x_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, state_ptr, starts_ptr,
                       lengths_ptr, slots_ptr, drafts_ptr, out_ptr, stride_x, stride_a, stride_b,
                       stride_slot, stride_out, scale, HK: tl.constexpr, HV: tl.constexpr,
                       K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Request ``i``, value head ``h``, ``BV`` value columns: the state block is read once from
    the request's slot, then per position decayed, corrected, stored to its draft slot."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    v_cols = tl.program_id(2) * BV + tl.arange(0, BV)
    vm = v_cols < V
    start = tl.load(starts_ptr + i)
    length = tl.load(lengths_ptr + i)
    slot = tl.load(slots_ptr + i).to(tl.int64)
    first = tl.load(drafts_ptr + i).to(tl.int64)
    rows = tl.arange(0, BK)
    km = rows < K
    offs = h * K * V + rows[:, None] * V + v_cols[None, :]
    mask = km[:, None] & vm[None, :]
    s = tl.load(state_ptr + slot * stride_slot + offs, mask=mask, other=0.0).to(tl.float32)
    decay_rate = tl.exp(tl.load(a_log_ptr + h))
    dt_bias = tl.load(dt_bias_ptr + h)
    for t in range(0, length):
        row = (start + t).to(tl.int64)
        s, o = _delta_step(s, x_ptr + row * stride_x, a_ptr + row * stride_a,
                           b_ptr + row * stride_b, h, decay_rate, dt_bias, rows, km, v_cols, vm,
                           scale, HK, HV, K, V)
        tl.store(out_ptr + row * stride_out + h * V + v_cols, o, mask=vm)
        # stored in the pool's dtype, and continued from what was stored (a bf16 pool rounds
        # every position's state, as the one-token kernel does step by step)
        s_stored = s.to(state_ptr.dtype.element_ty)
        tl.store(state_ptr + (first + t) * stride_slot + offs, s_stored, mask=mask)
        s = s_stored.to(tl.float32)


def gdn_verify(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
               dt_bias: torch.Tensor, ssm_state: torch.Tensor, starts: torch.Tensor,
               lengths: torch.Tensor, slots: torch.Tensor, drafts: torch.Tensor,
               num_k_heads: int, k_dim: int, scale: float) -> torch.Tensor:
    """The delta rule over the verifying requests' rows: x ``[T, C]`` (the conv output), a, b
    ``[T, HV]`` (rows contiguous), ``ssm_state [slots, HV, K, V]``. Returns ``[T, HV, V]`` in
    x's dtype."""
    hv, v_dim = ssm_state.shape[1], ssm_state.shape[3]
    out = torch.empty(x.shape[0], hv, v_dim, dtype=x.dtype, device=x.device)
    bv = min(32, triton.next_power_of_2(v_dim))
    if slots.shape[0]:
        _gdn_verify_kernel[(slots.shape[0], hv, triton.cdiv(v_dim, bv))](
            x, a, b, a_log, dt_bias, ssm_state, starts, lengths, slots, drafts, out, x.stride(0),
            a.stride(0), b.stride(0), ssm_state.stride(0), out.stride(0), scale, HK=num_k_heads,
            HV=hv, K=k_dim, V=v_dim, BK=triton.next_power_of_2(k_dim), BV=bv, num_warps=4)
    return out
