"""Gated DeltaNet kernels that read and write the state pool in place, by slot index.

A request's recurrent state never leaves its slot: each kernel takes the pool and the batch's slot
per request, so a decode step moves each state once in and once out (no gather into a dense batch
and scatter back), and the slot indices can live in a CUDA graph's static inputs. A slot < 0 is a
padding row: skipped (its outputs are zeros).

Layouts (``kvcache/state_pool.py``): conv state ``[slots, C, W - 1]`` (the last ``W - 1`` inputs,
oldest first), delta-rule state ``[slots, HV, K, V]`` in fp32 or bf16 (arithmetic is fp32).
The conv input ``x`` is ``[T, C]`` with ``C = 2 * HK * K + HV * V``: q heads | k heads | v heads.

- ``conv_decode``: one new input per request; the window shifts in place.
- ``conv_varlen``: prefill chunks back to back (``cu_seqlens``), each continuing from its slot's
  window or from zeros, then the windows updated (a second launch: every output must read the old
  window first).
- ``gdn_decode``: one token per request: the gating (``-exp(A_log) * softplus(a + dt_bias)``,
  ``sigmoid(b)``), the q/k L2 norm and the delta rule fused; the state is updated where it lies.

The torch reference for all three is ``layers/gated_delta.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _conv_step(src, dst, x, w, w_last, cm, W: tl.constexpr, WP: tl.constexpr):
    """One new input per channel onto a window of the last ``W - 1`` inputs (``src``: the
    ``[BLOCK_C, W - 1]`` block's base pointers): returns ``silu(conv)`` in fp32 and writes the
    shifted window ``[old[1:], x]`` at ``dst`` (``src`` itself for decode, a draft slot for a
    verify row). ``w``: the first ``W - 1`` taps ``[BLOCK_C, WP]``; ``w_last``: the last, fp32."""
    j = tl.arange(0, WP)
    old = cm[:, None] & (j[None, :] < W - 1)
    win = tl.load(src + j[None, :], mask=old, other=0.0).to(tl.float32)
    acc = tl.sum(win * w.to(tl.float32), axis=1) + x.to(tl.float32) * w_last
    shifted = tl.load(src + j[None, :] + 1, mask=cm[:, None] & (j[None, :] < W - 2), other=0.0)
    shifted = tl.where(j[None, :] == W - 2, x[:, None].to(shifted.dtype), shifted)
    tl.store(dst + j[None, :], shifted, mask=old)
    return _silu(acc)


@triton.jit(do_not_specialize_on_alignment=["slots_ptr"])
def _conv_decode_kernel(x_ptr, w_ptr, state_ptr, slots_ptr, out_ptr, C, stride_x, stride_slot,
                        stride_out, W: tl.constexpr, WP: tl.constexpr, BLOCK_C: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    slot = tl.load(slots_ptr + i).to(tl.int64)
    if slot < 0:
        tl.store(out_ptr + i * stride_out + c, tl.zeros([BLOCK_C], tl.float32), mask=cm)
        return
    j = tl.arange(0, WP)
    w = tl.load(w_ptr + c[:, None] * W + j[None, :], mask=cm[:, None] & (j[None, :] < W - 1),
                other=0.0)
    w_last = tl.load(w_ptr + c * W + (W - 1), mask=cm, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + i * stride_x + c, mask=cm, other=0.0)
    base = state_ptr + slot * stride_slot + c[:, None] * (W - 1)
    tl.store(out_ptr + i * stride_out + c, _conv_step(base, base, x, w, w_last, cm, W, WP),
             mask=cm)


def conv_decode(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                slots: torch.Tensor) -> torch.Tensor:
    """x ``[B, C]``, weight ``[C, W]``, slots ``[B]``: ``silu(conv)`` ``[B, C]`` in x's dtype."""
    batch, channels = x.shape
    width = weight.shape[-1]
    out = torch.empty_like(x)
    block = 256
    grid = (batch, triton.cdiv(channels, block))
    _conv_decode_kernel[grid](x, weight, conv_state, slots, out, channels, x.stride(0),
                              conv_state.stride(0), out.stride(0), W=width,
                              WP=triton.next_power_of_2(width), BLOCK_C=block)
    return out


# per-request metadata vectors, one entry read per program: no variant per alignment
@triton.jit(do_not_specialize_on_alignment=["slots_ptr", "cu_ptr", "seq_ptr", "init_ptr"])
def _conv_varlen_kernel(x_ptr, w_ptr, state_ptr, slots_ptr, cu_ptr, seq_ptr, init_ptr, out_ptr,
                        C, stride_x, stride_slot, stride_out, W: tl.constexpr, WP: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    """One token of one chunk over ``BLOCK_C`` channels: its window is the ``W - 1`` inputs before
    it, from the chunk where they exist and from the slot's window (or zeros) before the chunk."""
    t = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    seq = tl.load(seq_ptr + t)
    start = tl.load(cu_ptr + seq)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    # 1: continue from the slot's window (a scalar mask term: an int, as bool scalars do not mix
    # with tensor masks in the interpreter)
    use_state = tl.load(init_ptr + seq) * (slot >= 0).to(tl.int32)
    j = tl.arange(0, WP)
    src = t - (W - 1) + j  # the token each tap reads
    in_chunk = (src >= start) & (j < W)
    from_state = (src < start) & (j < W) & (j * 0 + use_state != 0)
    # tap j of a token p steps into its chunk reads the slot's window at W - 1 + (p - (W - 1) + j)
    state_col = W - 1 + (src - start)
    xv = tl.load(x_ptr + src[None, :].to(tl.int64) * stride_x + c[:, None],
                 mask=cm[:, None] & in_chunk[None, :], other=0.0).to(tl.float32)
    sv = tl.load(state_ptr + slot * stride_slot + c[:, None] * (W - 1) + state_col[None, :],
                 mask=cm[:, None] & from_state[None, :], other=0.0).to(tl.float32)
    w = tl.load(w_ptr + c[:, None] * W + j[None, :], mask=cm[:, None] & (j[None, :] < W),
                other=0.0).to(tl.float32)
    acc = tl.sum((xv + sv) * w, axis=1)
    tl.store(out_ptr + t * stride_out + c, _silu(acc), mask=cm)


@triton.jit(do_not_specialize_on_alignment=["slots_ptr", "cu_ptr", "init_ptr"])
def _conv_state_kernel(x_ptr, state_ptr, slots_ptr, cu_ptr, init_ptr, C, stride_x, stride_slot,
                       W: tl.constexpr, WP: tl.constexpr, BLOCK_C: tl.constexpr):
    """The window after a chunk: the last ``W - 1`` entries of ``[old window | chunk]``."""
    n = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = c < C
    slot = tl.load(slots_ptr + n).to(tl.int64)
    if slot < 0:
        return
    start = tl.load(cu_ptr + n)
    length = tl.load(cu_ptr + n + 1) - start
    has_init = tl.load(init_ptr + n)
    j = tl.arange(0, WP)
    keep = j < W - 1
    pos = length + j  # index into [old window (W - 1) | chunk (length)]
    from_x = keep & (pos >= W - 1)
    from_old = keep & (pos < W - 1) & (j * 0 + has_init != 0)
    base = state_ptr + slot * stride_slot + c[:, None] * (W - 1)
    xv = tl.load(x_ptr + (start + pos - (W - 1))[None, :].to(tl.int64) * stride_x + c[:, None],
                 mask=cm[:, None] & from_x[None, :], other=0.0)
    ov = tl.load(base + pos[None, :], mask=cm[:, None] & from_old[None, :], other=0.0)
    tl.store(base + j[None, :], tl.where(from_x[None, :], xv.to(ov.dtype), ov),
             mask=cm[:, None] & keep[None, :])


def conv_varlen(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                slots: torch.Tensor, cu_seqlens: torch.Tensor, token_seq: torch.Tensor,
                has_init: torch.Tensor) -> torch.Tensor:
    """x ``[T, C]`` (chunks back to back); per chunk ``n``: ``slots[n]``, its tokens
    ``cu_seqlens[n]:cu_seqlens[n + 1]`` (int32, starting at 0), ``has_init[n]`` (continue from the
    slot's window, else zeros); ``token_seq[t]``: the chunk of token ``t``. Returns ``silu(conv)``
    ``[T, C]`` and leaves each slot's window after its chunk."""
    tokens, channels = x.shape
    width = weight.shape[-1]
    out = torch.empty_like(x)
    block, wp = 128, triton.next_power_of_2(width)
    if tokens:
        _conv_varlen_kernel[(tokens, triton.cdiv(channels, block))](
            x, weight, conv_state, slots, cu_seqlens, token_seq, has_init, out, channels,
            x.stride(0), conv_state.stride(0), out.stride(0), W=width, WP=wp, BLOCK_C=block)
        _conv_state_kernel[(slots.shape[0], triton.cdiv(channels, block))](
            x, conv_state, slots, cu_seqlens, has_init, channels, x.stride(0),
            conv_state.stride(0), W=width, WP=wp, BLOCK_C=block)
    return out


@triton.jit
def _delta_step(s, x, a_row, b_row, h, decay_rate, dt_bias, rows, km, v_cols, vm, scale,
                HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """One token of the gated delta rule on value head ``h``'s state block ``s`` (``[BK, BV]``,
    fp32): ``x`` the token's conv output row (q | k | v heads), ``a_row`` / ``b_row`` its gate
    inputs, ``decay_rate`` = ``exp(A_log[h])``. The q/k L2 norm, the decay
    ``exp(-decay_rate * softplus(a + dt_bias))``, ``beta = sigmoid(b)``, the correction; returns
    (the new block, its output columns ``S^T q``)."""
    kh = h // (HV // HK)
    q = tl.load(x + kh * K + rows, mask=km, other=0.0).to(tl.float32)
    k = tl.load(x + HK * K + kh * K + rows, mask=km, other=0.0).to(tl.float32)
    v = tl.load(x + 2 * HK * K + h * V + v_cols, mask=vm, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k) + 1e-6)
    a = tl.load(a_row + h).to(tl.float32) + dt_bias
    softplus = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(a)))
    beta = tl.sigmoid(tl.load(b_row + h).to(tl.float32))
    s = s * tl.exp(-decay_rate * softplus)
    delta = (v - tl.sum(s * k[:, None], axis=0)) * beta
    s += k[:, None] * delta[None, :]
    return s, tl.sum(s * q[:, None], axis=0)


@triton.jit(do_not_specialize_on_alignment=["slots_ptr"])
def _gdn_decode_kernel(x_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, state_ptr, slots_ptr,
                       out_ptr, stride_x, stride_a, stride_b, stride_slot, stride_out, scale,
                       HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                       BK: tl.constexpr, BV: tl.constexpr):
    """Request ``i``, value head ``h``, ``BV`` of its value columns: the state block ``[K, BV]``
    is read once, decayed, corrected and written back; the output is ``S^T q``."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    v_cols = tl.program_id(2) * BV + tl.arange(0, BV)
    vm = v_cols < V
    out = out_ptr + i * stride_out + h * V + v_cols
    slot = tl.load(slots_ptr + i).to(tl.int64)
    if slot < 0:
        tl.store(out, tl.zeros([BV], tl.float32), mask=vm)
        return
    rows = tl.arange(0, BK)
    km = rows < K
    ptrs = state_ptr + slot * stride_slot + h * K * V + rows[:, None] * V + v_cols[None, :]
    mask = km[:, None] & vm[None, :]
    s = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    s, o = _delta_step(s, x_ptr + i * stride_x, a_ptr + i * stride_a, b_ptr + i * stride_b, h,
                       tl.exp(tl.load(a_log_ptr + h)), tl.load(dt_bias_ptr + h), rows, km,
                       v_cols, vm, scale, HK, HV, K, V)
    tl.store(ptrs, s.to(state_ptr.dtype.element_ty), mask=mask)
    tl.store(out, o, mask=vm)


def gdn_decode(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
               dt_bias: torch.Tensor, ssm_state: torch.Tensor, slots: torch.Tensor,
               num_k_heads: int, k_dim: int, scale: float,
               out: torch.Tensor | None = None, block_v: int | None = None,
               num_warps: int | None = None) -> torch.Tensor:
    """One token per request onto its slot's state. x ``[B, C]`` (the conv output: q | k | v),
    a, b ``[B, HV]`` (each row contiguous), ``ssm_state [slots, HV, K, V]``. Returns
    ``[B, HV, V]`` in x's dtype (into ``out``, a contiguous tensor, when given). ``block_v`` /
    ``num_warps``: the program's block of value columns and its warps (default 64 / 4, the best
    of ``benchmark/kernels/bench_gated_delta.py --sweep`` on an H100 for both state dtypes)."""
    batch = x.shape[0]
    hv, v_dim = ssm_state.shape[1], ssm_state.shape[3]
    if out is None:
        out = torch.empty(batch, hv, v_dim, dtype=x.dtype, device=x.device)
    bv = block_v or min(64, triton.next_power_of_2(v_dim))
    grid = (batch, hv, triton.cdiv(v_dim, bv))
    _gdn_decode_kernel[grid](x, a, b, a_log, dt_bias, ssm_state, slots, out, x.stride(0),
                             a.stride(0), b.stride(0), ssm_state.stride(0), out.stride(0), scale,
                             HK=num_k_heads, HV=hv, K=k_dim, V=v_dim,
                             BK=triton.next_power_of_2(k_dim), BV=bv, num_warps=num_warps or 4)
    return out
