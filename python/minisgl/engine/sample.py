"""Batch sampling: penalties -> logit_bias -> grammar mask -> temperature -> min_p -> top_k -> top_p
-> draw, one row per request, with no host sync on the way.

``sample`` picks a path: plain greedy batches take the argmax of the logits as they are; on CUDA
everything else runs in Triton (``kernel/triton/sampling_split.py``: a split-row fast path, with
the one-program-per-row kernel of ``sampling.py`` finishing the rows it cannot decide exactly;
``MINISGL_SAMPLER=triton-row``: that kernel alone, ``torch``: the reference); the torch reference
(``sample_torch.py``) is the CPU path and the oracle of the kernel's tests. Token counts for the
penalties and the logit biases live on the device (``sample_state.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from minisgl import env
from minisgl.utils.transfer import to_device

from .sample_state import SamplingState
from .sample_torch import (
    _i64,
    apply_penalties,
    apply_token_bitmask,
    random_uniform,
    sample_torch,
    unpack_bitmask,
)

if TYPE_CHECKING:
    from minisgl.core import Req
    from minisgl.kernel.triton.sampling_rows import TopLogits

__all__ = [
    "PenaltyArgs",
    "BiasArgs",
    "BatchSamplingArgs",
    "SampleOutput",
    "SamplingState",
    "sample",
    "apply_penalties",
    "apply_token_bitmask",
    "unpack_bitmask",
    "random_uniform",
]

_GREEDY_EPS = 1e-5  # below this a temperature counts as greedy (as in vLLM): 1/T would blow up


@dataclass
class PenaltyArgs:
    """The counts buffer and, per sampled row, its counts row (-1: no penalties) and penalties."""

    counts: torch.Tensor  # [rows, V] int32 (see sample_state.py)
    rows: torch.Tensor  # [B] int64
    presence: torch.Tensor  # [B] float32
    frequency: torch.Tensor  # [B] float32
    repetition: torch.Tensor  # [B] float32


@dataclass
class BiasArgs:
    bias: torch.Tensor  # [rows, V] float32
    rows: torch.Tensor  # [B] int64, -1: no logit_bias


@dataclass
class BatchSamplingArgs:
    """Per-row sampling settings as device tensors, plus host-side flags that pick the code path.

    ``top_k``/``top_p``/``min_p`` are ``None`` when no sampled row uses them (the torch path skips
    their work); ``filters`` holds all three for every row (neutral values where off: top_k = V,
    top_p = 1, min_p = 0) for the kernel. Greedy rows (temperature 0 / below 1e-5, or top_k 1) have
    temperature 0 and neutral filters. ``temperatures``/``seeds``/``steps`` are ``None`` only in
    ``from_reqs(argmax_only=True)``'s args of a plain greedy batch, which ``sample`` never reads.
    """

    temperatures: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    seeds: torch.Tensor | None
    steps: torch.Tensor | None
    penalties: PenaltyArgs | None
    all_greedy: bool
    max_top_logprobs: int
    need_logprobs: bool
    # structured output: int32 [B, ceil(V / 32)], bit (id % 32) of word (id // 32) set = allowed
    # (xgrammar's layout); None when no row is constrained. Filled by the scheduler's grammar code.
    token_bitmask: torch.Tensor | None = None
    bias: BiasArgs | None = None
    filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    max_top_k: int = 0  # the largest top_k in use (0: none); the kernel gathers at most CAND
    # when set, the engine calls it after the forward, before sampling, for ``token_bitmask``: the
    # scheduler reads the previous step back meanwhile (a grammar's mask needs its last token)
    late_bitmask: Callable[[], torch.Tensor | None] | None = None

    @property
    def argmax_only(self) -> bool:
        """``from_reqs(argmax_only=True)``'s args of a plain greedy batch: the argmax is the whole
        sampling (the decode graph then does it itself, ``graph.py``)."""
        return self.temperatures is None

    @classmethod
    def from_reqs(cls, reqs: list[Req], vocab_size: int, device: torch.device,
                  state: SamplingState | None = None,
                  argmax_only: bool = False) -> BatchSamplingArgs:
        """``state`` holds the device rows of the running requests (the engine's); without one
        (tests, one-off calls) a temporary state gives row ``i`` to the ``i``-th request.
        ``argmax_only``: no grammar constrains these rows (the scheduler knows), so a plain greedy
        batch (no penalties, biases or log-probs) is sampled by ``sample``'s argmax and its
        settings need not reach the device: two copies fewer in a one-token decode step."""
        params = [req.sampling_params for req in reqs]
        greedy = [p.is_greedy or p.temperature < _GREEDY_EPS for p in params]
        use_pen = any(p.needs_penalties for p in params)
        use_bias = any(p.logit_bias for p in params)
        need_logprobs = any(p.logprobs or p.top_logprobs > 0 for p in params)
        if argmax_only and all(greedy) and not (use_pen or use_bias or need_logprobs):
            return cls(None, None, None, None, None, None, None, all_greedy=True,
                       max_top_logprobs=0, need_logprobs=False)
        top_k = [
            vocab_size if g or p.top_k <= 0 else min(p.top_k, vocab_size)
            for p, g in zip(params, greedy)
        ]
        top_p = [1.0 if g else p.top_p for p, g in zip(params, greedy)]
        min_p = [0.0 if g else p.min_p for p, g in zip(params, greedy)]
        use_top_k = any(k < vocab_size for k in top_k)
        use_top_p, use_min_p = any(p < 1 for p in top_p), any(p > 0 for p in min_p)
        temperatures = [0.0 if g else p.temperature for p, g in zip(params, greedy)]
        rows: list[int] = []
        if use_pen or use_bias:
            if state is None:
                state = SamplingState(len(reqs), vocab_size, device)
                rows = list(range(len(reqs)))
            else:
                rows = [req.table_idx for req in reqs]
            state.prepare(reqs, rows)
        pen = [[p.presence_penalty for p in params], [p.frequency_penalty for p in params],
               [p.repetition_penalty for p in params]] if use_pen else [[], [], []]
        floats = to_device([temperatures, top_p, min_p, *pen], torch.float32, device)
        # steps: the output index of the token being sampled; read from the counters, not from
        # input_ids, which lags one token behind under overlap scheduling
        count_rows = [r if p.needs_penalties else -1 for r, p in zip(rows, params)] if use_pen else []
        bias_rows = [r if p.logit_bias else -1 for r, p in zip(rows, params)] if use_bias else []
        ints = to_device([[_i64(req.seed) for req in reqs],
                          [req.device_len - req.prompt_len for req in reqs],
                          top_k, count_rows, bias_rows], torch.int64, device)
        return cls(
            temperatures=floats[0],
            top_k=ints[2] if use_top_k else None,
            top_p=floats[1] if use_top_p else None,
            min_p=floats[2] if use_min_p else None,
            seeds=ints[0],
            steps=ints[1],
            penalties=PenaltyArgs(state.counts, ints[3], *floats[3:6]) if use_pen else None,
            all_greedy=all(greedy),
            max_top_logprobs=max((p.top_logprobs for p in params), default=0),
            need_logprobs=need_logprobs,
            bias=BiasArgs(state.bias, ints[4]) if use_bias else None,
            filters=(ints[2], floats[1], floats[2]),
            max_top_k=max((k for k in top_k if k < vocab_size), default=0),
        )


@dataclass
class SampleOutput:
    """Chosen tokens and, when asked, log-probs under the raw model distribution (vLLM's default)."""

    next_tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None  # [B] float32
    top_ids: torch.Tensor | None  # [B, max_top_logprobs] int64, descending log-prob
    top_logprobs: torch.Tensor | None  # [B, max_top_logprobs] float32


def _use_kernel(logits: torch.Tensor, args: BatchSamplingArgs) -> bool:
    if not logits.is_cuda or env.SAMPLER.get() == "torch":
        return False
    from minisgl.kernel.triton.sampling import CAND

    return args.max_top_k <= CAND


def kernel_sample(logits: torch.Tensor, args: BatchSamplingArgs, **sizes: Any
                  ) -> tuple[torch.Tensor, torch.Tensor | None, TopLogits | None]:
    """Tokens, raw logsumexp (when log-probs are asked) and the top ``max_top_logprobs`` raw
    logits (when the split path ran) from the Triton kernels; counts the sampled tokens of
    penalised rows. ``sizes``: the kernels' ``block``/``cand``/``chunk``/``topc``/``keep``, and
    ``flags_out`` for the rows the row kernel finished (tests, bench)."""
    from minisgl.kernel.triton.sampling_rows import sample_rows

    pen, bias = args.penalties, args.bias
    return sample_rows(
        logits.contiguous(), args.temperatures, *args.filters, args.seeds, args.steps,
        counts=pen.counts if pen else None, count_rows=pen.rows if pen else None,
        penalties=(pen.presence, pen.frequency, pen.repetition) if pen else None,
        bias=bias.bias if bias else None, bias_rows=bias.rows if bias else None,
        bitmask=args.token_bitmask, need_lse=args.need_logprobs,
        top_n=args.max_top_logprobs if args.need_logprobs else 0, **sizes,
    )


def _count_tokens(args: BatchSamplingArgs, tokens: torch.Tensor) -> None:
    """Add each sampled token to its row's counts (penalised rows only), on the device."""
    pen = args.penalties
    if pen is not None:
        active = (pen.rows >= 0).to(torch.int32)
        pen.counts.index_put_((pen.rows.clamp(min=0), tokens), active, accumulate=True)


def sample(logits: torch.Tensor, args: BatchSamplingArgs) -> SampleOutput:
    """Pick one token per row of ``logits`` [B, V] (any float dtype)."""
    plain = args.penalties is None and args.bias is None and args.token_bitmask is None
    if args.all_greedy and plain and not args.need_logprobs:
        return SampleOutput(logits.argmax(dim=-1), None, None, None)  # exact in any dtype
    assert args.temperatures is not None, "argmax_only args of a batch that is not plain greedy"
    top = None
    if _use_kernel(logits, args):
        tokens, lse, top = kernel_sample(logits, args)
    else:
        tokens, lse = sample_torch(logits, args), None
        _count_tokens(args, tokens)
    if not args.need_logprobs:
        return SampleOutput(tokens, None, None, None)
    if lse is None:
        lse = logits.float().logsumexp(dim=-1)
    lse = lse.unsqueeze(1)
    chosen = (logits.gather(1, tokens.unsqueeze(1)).float() - lse).squeeze(1)
    if args.max_top_logprobs <= 0:
        return SampleOutput(tokens, chosen, None, None)
    if top is None:  # the torch path, or the row kernel alone
        values, ids = logits.topk(min(args.max_top_logprobs, logits.shape[-1]), dim=-1)
    else:
        ids, values = top
    return SampleOutput(tokens, chosen, ids, values.float() - lse)
