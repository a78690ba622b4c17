"""The per-batch sampling settings as device tensors: what ``sample`` and its kernels read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from minisgl.utils.transfer import to_device

from .rng import wrap_i64
from .state import SamplingState

if TYPE_CHECKING:
    from minisgl.core import Req

GREEDY_EPS = 1e-5  # below this a temperature counts as greedy (as in vLLM): 1/T would blow up


@dataclass
class PenaltyArgs:
    """The counts buffer and, per sampled row, its counts row (-1: no penalties) and penalties."""

    counts: torch.Tensor  # [rows, V] int32 (see state.py)
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
    # this batch's sampler (one of ``sampler.SAMPLERS``) when not the engine's: the torch
    # reference while the engine's kernels for it still compile (``scheduler/warming.py``)
    sampler: str | None = None

    @property
    def argmax_only(self) -> bool:
        """``from_reqs(argmax_only=True)``'s args of a plain greedy batch: the argmax is the whole
        sampling (the decode graph then does it itself, ``engine/graph.py``)."""
        return self.temperatures is None

    @classmethod
    def from_reqs(cls, reqs: list[Req], vocab_size: int, device: torch.device,
                  state: SamplingState | None = None,
                  argmax_only: bool = False,
                  steps: list[int] | None = None) -> BatchSamplingArgs:
        """``state`` holds the device rows of the running requests (the engine's); without one
        (tests, one-off calls) a temporary state gives row ``i`` to the ``i``-th request.
        ``argmax_only``: no grammar constrains these rows (the scheduler knows), so a plain greedy
        batch (no penalties, biases or log-probs) is sampled by ``sample``'s argmax and its
        settings need not reach the device: two copies fewer in a one-token decode step.
        ``steps``: each row's output index, when not the request's next one (speculative
        decoding verifies several positions of one request, ``minisgl/speculative/``)."""
        params = [req.sampling_params for req in reqs]
        greedy = [p.is_greedy or p.temperature < GREEDY_EPS for p in params]
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
        count_rows = ([r if p.needs_penalties else -1 for r, p in zip(rows, params)]
                      if use_pen else [])
        bias_rows = [r if p.logit_bias else -1 for r, p in zip(rows, params)] if use_bias else []
        ints = to_device([[wrap_i64(req.seed) for req in reqs],
                          steps if steps is not None
                          else [req.device_len - req.prompt_len for req in reqs],
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
