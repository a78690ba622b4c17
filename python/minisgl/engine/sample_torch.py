"""The torch reference of batch sampling, and the CPU path: penalties -> logit_bias -> grammar mask
-> temperature -> min_p -> top_k -> top_p -> draw, one row per request.

Randomness is a pure function of ``(seed, step, vocab index)``: a splitmix64 hash evaluated with
vectorised int64 ops turns each triple into a uniform, and the token is drawn with the
exponential race ``argmax(p_i / E_i)`` (Gumbel-max in log space). A request therefore gets the same
token for the same logits whatever else shares the batch, without per-request ``torch.Generator``
objects. The Triton kernel (``kernel/triton/sampling.py``) computes the same thing without sorting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .sample_state import COUNT_MASK

if TYPE_CHECKING:
    from .sample import BatchSamplingArgs


def _i64(value: int) -> int:
    """Wrap a Python int into int64 two's complement, the way torch's int64 arithmetic wraps."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_MIX1 = _i64(0xBF58476D1CE4E5B9)
_MIX2 = _i64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift: torch's ``>>`` on int64 is arithmetic, so mask the copied sign bits."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def _mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser (a bijection on 64 bits); mutates ``z``, which callers own."""
    z.bitwise_xor_(_shr(z, 30)).mul_(_MIX1)
    z.bitwise_xor_(_shr(z, 27)).mul_(_MIX2)
    return z.bitwise_xor_(_shr(z, 31))


def random_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1), shape [B, V], from a counter-based hash of (seed, step, index).

    Row ``b`` seeds a splitmix64 stream at ``mix(mix(seed + G) + (step + 1) * G)`` and index
    ``i`` is its ``i``-th output, so a value depends on nothing but its own triple. The top 63
    bits become a float32 through an int->float conversion, which keeps full relative precision
    near 0: the race needs ``E = -log1p(-u)`` accurate for tiny E, where unlikely tokens win.
    """
    row = _mix64(seeds.to(torch.int64) + _GOLDEN)
    row = _mix64(row + (steps.to(torch.int64) + 1) * _GOLDEN)
    idx = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=seeds.device)
    h = _mix64(idx.mul_(_GOLDEN).unsqueeze(0) + row.unsqueeze(1))
    u = _shr(h, 1).to(torch.float32).mul_(2.0**-63).add_(2.0**-64)
    return u.clamp_(max=1.0 - 2.0**-24)  # values within 2**-25 of 1 round to 1.0 in float32


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
