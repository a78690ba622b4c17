"""The torch reference of batch sampling, and the CPU path: penalties -> logit_bias -> grammar mask
-> temperature -> min_p -> top_k -> top_p -> draw, one row per request.

The token is drawn with the exponential race ``argmax(p_i / E_i)`` (Gumbel-max in log space) over
uniforms that are a pure function of ``(seed, step, vocab index)`` (``rng.py``), so a request gets
the same token for the same logits whatever else shares the batch. The Triton kernels
(``kernels/``) compute the same thing without sorting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .rng import random_uniform
from .state import COUNT_MASK

if TYPE_CHECKING:
    from .args import BatchSamplingArgs


def apply_penalties(logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Return penalised and biased float32 logits (a new tensor; the input is never modified).

    Repetition first, over prompt+output tokens, HF style (positive logits divided, others
    multiplied); then ``logit -= frequency * count + presence * (count > 0)`` over output tokens;
    then ``logit_bias``. Counts and biases are the request rows of the device buffers.
    """
    logits = logits.float().clone()
    pen, bias = args.penalties, args.bias
    if pen is not None:
        active = (pen.rows >= 0).unsqueeze(1)
        counts = pen.counts[pen.rows.clamp(min=0)]
        seen = (counts != 0) & active
        n = torch.where(active, counts & COUNT_MASK, 0).float()
        rep = pen.repetition.unsqueeze(1)
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
        freq, pres = pen.frequency.unsqueeze(1), pen.presence.unsqueeze(1)
        logits = logits - freq * n - pres * (n > 0)
    if bias is not None:
        active = (bias.rows >= 0).unsqueeze(1)
        logits = logits + torch.where(active, bias.bias[bias.rows.clamp(min=0)], 0.0)
    return logits


def _filter(scaled: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Set to -inf the tokens that min_p, then top_k, then top_p (on the renormalised rest) remove.

    top_k/top_p pick a per-row threshold value in sorted order and keep every token at or above it,
    so kept logits are never rewritten (a row with its filters off is bit-identical to no filtering)
    and exact ties at the boundary are all kept.
    """
    if args.min_p is not None:
        floor = scaled.amax(dim=-1, keepdim=True) + args.min_p.log().unsqueeze(1)
        scaled = scaled.masked_fill(scaled < floor, float("-inf"))
    if args.top_k is None and args.top_p is None:
        return scaled
    vocab = scaled.shape[-1]
    ordered = scaled.sort(dim=-1, descending=True, stable=True).values
    n_keep = torch.isfinite(ordered).sum(dim=-1, keepdim=True).clamp_(min=1)
    if args.top_k is not None:
        n_keep = torch.minimum(n_keep, args.top_k.unsqueeze(1).clamp(1, vocab))
    if args.top_p is not None:
        rank = torch.arange(vocab, device=scaled.device).unsqueeze(0)
        probs = ordered.masked_fill(rank >= n_keep, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        top_p = args.top_p.unsqueeze(1)
        in_nucleus = (mass_before < top_p) | (top_p >= 1)
        n_keep = torch.minimum(n_keep, in_nucleus.sum(dim=-1, keepdim=True).clamp_(min=1))
    threshold = ordered.gather(1, n_keep - 1)
    return scaled.masked_fill(scaled < threshold, float("-inf"))


def _draw(logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Exponential race on the filtered distribution: argmax(log p - log E), E = -log1p(-u)."""
    temps = args.temperatures.unsqueeze(1)
    scaled = _filter(logits / torch.where(temps > 0, temps, torch.ones_like(temps)), args)
    u = random_uniform(args.seeds, args.steps, logits.shape[-1])
    log_e = u.neg_().log1p_().neg_().log_()
    return (scaled - log_e).argmax(dim=-1)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 [B, ceil(V / 32)] bitmask -> bool [B, V] (True = allowed)."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = (bitmask.unsqueeze(-1) >> bits) & 1
    return allowed.flatten(1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Disallowed tokens -> -inf (a new tensor)."""
    return logits.masked_fill(~unpack_bitmask(bitmask, logits.shape[-1]), float("-inf"))


def sample_torch(logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Tokens [B] int64 of the reference path (float32 throughout)."""
    adjusted = logits.float()
    if args.penalties is not None or args.bias is not None:
        adjusted = apply_penalties(adjusted, args)
    if args.token_bitmask is not None:
        adjusted = apply_token_bitmask(adjusted, args.token_bitmask)
    greedy = adjusted.argmax(dim=-1)
    if args.all_greedy:
        return greedy
    return torch.where(args.temperatures > 0, _draw(adjusted, args), greedy)
