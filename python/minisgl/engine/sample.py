"""Batch sampling: penalties -> temperature -> min_p -> top_k -> top_p -> draw, one row per request.

Randomness is a pure function of ``(seed, step, vocab index)``: a splitmix64 hash evaluated with
vectorised int64 ops turns each triple into a uniform, and the token is drawn with the
exponential race ``argmax(p_i / E_i)`` (Gumbel-max in log space). A request therefore gets the same
token for the same logits whatever else shares the batch, without per-request ``torch.Generator``
objects, and the whole path (no logprobs requested) runs on the device with no host sync.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from minisgl.utils.transfer import to_device

if TYPE_CHECKING:
    from minisgl.core import Req

__all__ = [
    "PenaltyArgs",
    "BatchSamplingArgs",
    "SampleOutput",
    "sample",
    "apply_penalties",
    "random_uniform",
]

_GREEDY_EPS = 1e-5  # below this a temperature counts as greedy (as in vLLM): 1/T would blow up


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


@dataclass
class PenaltyArgs:
    """Sparse token statistics for the penalties; dense [B, V] maps are built on the device.

    ``out_*`` list (row, token, count) of OUTPUT tokens for presence/frequency; ``seen_*`` list the
    distinct prompt+output tokens per row for the repetition penalty. Rows without a penalty list
    nothing and carry neutral values, so one scatter serves the whole batch.
    """

    presence: torch.Tensor  # [B] float32
    frequency: torch.Tensor  # [B] float32
    repetition: torch.Tensor  # [B] float32
    out_rows: torch.Tensor  # [N] int64
    out_ids: torch.Tensor  # [N] int64
    out_counts: torch.Tensor  # [N] float32
    seen_rows: torch.Tensor  # [M] int64
    seen_ids: torch.Tensor  # [M] int64
    use_repetition: bool
    use_counts: bool


def _penalty_args(reqs: list[Req], vocab_size: int, device: torch.device) -> PenaltyArgs | None:
    params = [req.sampling_params for req in reqs]
    if not any(p.needs_penalties for p in params):
        return None
    out_rows: list[int] = []
    out_ids: list[int] = []
    out_counts: list[float] = []
    seen_rows: list[int] = []
    seen_ids: list[int] = []
    for row, (req, p) in enumerate(zip(reqs, params)):
        if p.presence_penalty != 0 or p.frequency_penalty != 0:
            counts = Counter(t for t in req.input_ids[req.prompt_len :] if 0 <= t < vocab_size)
            out_rows += [row] * len(counts)
            out_ids += counts.keys()
            out_counts += map(float, counts.values())
        if p.repetition_penalty != 1:
            seen = {t for t in req.input_ids if 0 <= t < vocab_size}
            seen_rows += [row] * len(seen)
            seen_ids += seen
    presence, frequency, repetition, out_counts = to_device(
        [[p.presence_penalty for p in params], [p.frequency_penalty for p in params],
         [p.repetition_penalty for p in params], out_counts], torch.float32, device)
    out_rows, out_ids, seen_rows, seen_ids = to_device(
        [out_rows, out_ids, seen_rows, seen_ids], torch.int64, device)
    return PenaltyArgs(
        presence=presence, frequency=frequency, repetition=repetition,
        out_rows=out_rows, out_ids=out_ids, out_counts=out_counts,
        seen_rows=seen_rows, seen_ids=seen_ids,
        use_repetition=any(p.repetition_penalty != 1 for p in params),
        use_counts=any(p.presence_penalty != 0 or p.frequency_penalty != 0 for p in params),
    )


@dataclass
class BatchSamplingArgs:
    """Per-row sampling settings as device tensors, plus host-side flags that pick the code path.

    Filters are ``None`` when no sampled row uses them, so the common cases skip their work;
    rows that disable a filter in a mixed batch carry its neutral value (top_k = V, top_p = 1,
    min_p = 0).
    Greedy rows (temperature 0 / below 1e-5, or top_k 1) have temperature 0 and neutral filters.
    """

    temperatures: torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    seeds: torch.Tensor
    steps: torch.Tensor
    penalties: PenaltyArgs | None
    all_greedy: bool
    max_top_logprobs: int
    need_logprobs: bool
    # structured output: int32 [B, ceil(V / 32)], bit (id % 32) of word (id // 32) set = allowed
    # (xgrammar's layout); None when no row is constrained. Filled by the scheduler's grammar code.
    token_bitmask: torch.Tensor | None = None
    # when set, the engine calls it after the forward, before sampling, for ``token_bitmask``: the
    # scheduler reads the previous step back meanwhile (a grammar's mask needs its last token)
    late_bitmask: Callable[[], torch.Tensor | None] | None = None

    @classmethod
    def from_reqs(cls, reqs: list[Req], vocab_size: int, device: torch.device) -> BatchSamplingArgs:
        params = [req.sampling_params for req in reqs]
        greedy = [p.is_greedy or p.temperature < _GREEDY_EPS for p in params]
        top_k = [
            vocab_size if g or p.top_k <= 0 else min(p.top_k, vocab_size)
            for p, g in zip(params, greedy)
        ]
        top_p = [1.0 if g else p.top_p for p, g in zip(params, greedy)]
        min_p = [0.0 if g else p.min_p for p, g in zip(params, greedy)]
        use_top_k = any(k < vocab_size for k in top_k)
        use_top_p, use_min_p = any(p < 1 for p in top_p), any(p > 0 for p in min_p)
        temperatures = [0.0 if g else p.temperature for p, g in zip(params, greedy)]
        floats = to_device([temperatures, top_p if use_top_p else [], min_p if use_min_p else []],
                           torch.float32, device)
        # steps: the output index of the token being sampled; read from the counters, not from
        # input_ids, which lags one token behind under overlap scheduling
        ints = to_device([[_i64(req.seed) for req in reqs],
                          [req.device_len - req.prompt_len for req in reqs],
                          top_k if use_top_k else []], torch.int64, device)
        return cls(
            temperatures=floats[0],
            top_k=ints[2] if use_top_k else None,
            top_p=floats[1] if use_top_p else None,
            min_p=floats[2] if use_min_p else None,
            seeds=ints[0],
            steps=ints[1],
            penalties=_penalty_args(reqs, vocab_size, device),
            all_greedy=all(greedy),
            max_top_logprobs=max((p.top_logprobs for p in params), default=0),
            need_logprobs=any(p.logprobs or p.top_logprobs > 0 for p in params),
        )


@dataclass
class SampleOutput:
    """Chosen tokens and, when asked, log-probs under the raw model distribution (vLLM's default)."""

    next_tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None  # [B] float32
    top_ids: torch.Tensor | None  # [B, max_top_logprobs] int64, descending log-prob
    top_logprobs: torch.Tensor | None  # [B, max_top_logprobs] float32


def apply_penalties(logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
    """Return penalised float32 logits (a new tensor; the input is never modified).

    Repetition first, over prompt+output tokens, HF style (positive logits divided, others
    multiplied); then ``logit -= frequency * count + presence * (count > 0)`` over output tokens.
    """
    logits = logits.float()
    pen = args.penalties
    if pen is None:
        return logits.clone()
    shape = logits.shape
    if pen.use_repetition:
        seen = torch.zeros(shape, dtype=torch.bool, device=logits.device)
        hit = torch.ones_like(pen.seen_ids, dtype=torch.bool)
        seen.index_put_((pen.seen_rows, pen.seen_ids), hit)
        rep = pen.repetition.unsqueeze(1)
        logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    if pen.use_counts:
        counts = torch.zeros(shape, dtype=torch.float32, device=logits.device)
        counts.index_put_((pen.out_rows, pen.out_ids), pen.out_counts)
        freq, pres = pen.frequency.unsqueeze(1), pen.presence.unsqueeze(1)
        logits = logits - freq * counts - pres * (counts > 0)
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


def sample(logits: torch.Tensor, args: BatchSamplingArgs) -> SampleOutput:
    """Pick one token per row of ``logits`` [B, V] (any float dtype). Plain greedy batches take the
    argmax of the logits as they are; everything else is computed in float32."""
    plain = args.penalties is None and args.token_bitmask is None
    if args.all_greedy and plain and not args.need_logprobs:
        return SampleOutput(logits.argmax(dim=-1), None, None, None)  # exact in any dtype
    raw = logits.float()
    penalised = apply_penalties(raw, args) if args.penalties is not None else raw
    if args.token_bitmask is not None:
        penalised = apply_token_bitmask(penalised, args.token_bitmask)
    greedy = penalised.argmax(dim=-1)
    if args.all_greedy:
        tokens = greedy
    else:
        tokens = torch.where(args.temperatures > 0, _draw(penalised, args), greedy)
    if not args.need_logprobs:
        return SampleOutput(tokens, None, None, None)
    log_probs = raw.log_softmax(dim=-1)
    chosen = log_probs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    if args.max_top_logprobs <= 0:
        return SampleOutput(tokens, chosen, None, None)
    top = log_probs.topk(min(args.max_top_logprobs, log_probs.shape[-1]), dim=-1)
    return SampleOutput(tokens, chosen, top.indices, top.values)
