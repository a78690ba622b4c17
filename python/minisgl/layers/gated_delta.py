"""Gated DeltaNet ops in plain torch: the reference the GPU kernels are checked against, and what
CPU runs.

Token layout is packed (varlen): ``x[T, ...]`` holds the batch's requests back to back, request
``i`` owning rows ``cu_seqlens[i]:cu_seqlens[i + 1]``. Per-request state lives in slots of a state
pool (``kvcache/state_pool.py``); request ``i`` reads and writes slot ``slots[i]``, and starts
from zeros when ``fresh[i]`` (its first token is the prompt's first).

The gated delta rule, per value head, with state ``S [k_dim, v_dim]`` (fp32)::

    S <- exp(g_t) * S                      decay
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T   delta update: write the correction only
    o_t = S^T (q_t * scale)

The chunked form computes the same thing a chunk at a time (a UT transform inside each chunk,
one state product per chunk); ``tests/kernels/test_gated_delta.py`` holds them equal.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in fp32 (the convention of fla and HF)."""
    xf = x.float()
    return xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` (plain weight, not 1 + weight), then times ``silu(gate)``; fp32 inside."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = (weight * xf.to(dtype)) * F.silu(gate.float())
    return out.to(dtype)


def gdn_gating(a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor,
               dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) in fp32: the log-decay ``-exp(A_log) * softplus(a + dt_bias)``, and
    ``sigmoid(b)``."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def _expand_groups(q: torch.Tensor, k: torch.Tensor, num_v_heads: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each key head serves ``num_v_heads // num_k_heads`` consecutive value heads."""
    rep = num_v_heads // q.shape[-2]
    if rep == 1:
        return q, k
    return q.repeat_interleave(rep, dim=-2), k.repeat_interleave(rep, dim=-2)


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor, scale: float
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, token by token. q, k ``[L, Hk, K]`` (already L2-normalised), v ``[L, H, V]``,
    g, beta ``[L, H]``, state ``[H, K, V]`` fp32. Returns (o ``[L, H, V]`` in fp32, new state)."""
    q, k = _expand_groups(q, k, v.shape[-2])
    q, k, v = q.float() * scale, k.float(), v.float()
    s = state.float().clone()
    out = torch.empty_like(v)
    for t in range(v.shape[0]):
        s = s * g[t].float().exp()[:, None, None]
        kv = torch.einsum("hkv,hk->hv", s, k[t])
        delta = (v[t] - kv) * beta[t].float()[:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", s, q[t])
    return out, s


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, state: torch.Tensor, scale: float,
                           chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as ``recurrent_gated_delta_rule``, a chunk of ``chunk`` tokens at a time.

    Inside a chunk the delta updates are a unit lower-triangular system (the UT transform):
    solving it gives the chunk's corrected values ``u`` and decayed keys ``w`` at once; the state
    is read once at the chunk's start and written once at its end."""
    q, k = _expand_groups(q, k, v.shape[-2])
    length, pad = v.shape[0], -v.shape[0] % chunk

    def split(x: torch.Tensor) -> torch.Tensor:  # [L, H, ...] -> [H, N, C, ...], zero-padded
        x = F.pad(x.float(), (0, 0) * (x.dim() - 1) + (0, pad))
        return x.reshape(-1, chunk, *x.shape[1:]).movedim(2, 0)

    q, k, v, g, beta = split(q * scale), split(k), split(v), split(g), split(beta)
    cum = g.cumsum(-1)  # [H, N, C]: log of the decay from the chunk's start through token i
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).triu(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(future, float("-inf")).exp()
    kb = k * beta[..., None]
    # (I + A) u = beta v and (I + A) w = beta k exp(cum), A_ij = beta_i (k_i . k_j) d_ij for i > j
    eye = torch.eye(chunk, dtype=v.dtype, device=v.device)
    system = eye + (kb @ k.transpose(-1, -2) * decay).tril(-1)
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False,
                                      unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * cum.exp()[..., None], upper=False,
                                      unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay  # causal within the chunk, the diagonal included
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]
    s = state.float().clone()
    out = torch.empty_like(v)
    for n in range(v.shape[1]):
        new_v = u[:, n] - w[:, n] @ s
        out[:, n] = q_decayed[:, n] @ s + attn[:, n] @ new_v
        s = s * cum[:, n, -1].exp()[:, None, None] + k_to_end[:, n].transpose(-1, -2) @ new_v
    out = out.movedim(0, 2).reshape(-1, out.shape[0], out.shape[-1])[:length]
    return out, s


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  conv_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: depthwise causal conv then SiLU. x ``[L, C]``, weight ``[C, W]``,
    conv_state ``[C, W - 1]`` (the previous ``W - 1`` inputs, oldest first). Returns (out ``[L, C]``
    in x's dtype, new conv state: the last ``W - 1`` inputs of ``[conv_state | x]``)."""
    width = weight.shape[-1]
    full = torch.cat([conv_state.to(x.dtype), x.t()], dim=-1)  # [C, W - 1 + L]
    out = F.conv1d(full[None].to(weight.dtype), weight[:, None, :], bias, groups=weight.shape[0])
    return F.silu(out[0].t()).to(x.dtype), full[:, full.shape[-1] - (width - 1):]
