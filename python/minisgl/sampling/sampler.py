"""Batch sampling: penalties -> logit_bias -> grammar mask -> temperature -> min_p -> top_k -> top_p
-> draw, one row per request, with no host sync on the way.

``sample`` picks a path: plain greedy batches take the argmax of the logits as they are; otherwise
the engine's sampler (one of ``SAMPLERS``, fixed when the engine is built) decides. ``triton``: on
CUDA the Triton kernels (``kernels/split.py``: a split-row fast path, with the one-program-per-row
kernel of ``kernels/row.py`` finishing the rows it cannot decide exactly); ``triton-row``: that row
kernel alone; ``torch``: the reference (``torch_ref.py``), which is also the CPU path and the
oracle of the kernels' tests. Token counts for the penalties and the logit biases live on the device
(``state.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .args import BatchSamplingArgs
from .torch_ref import sample_torch

if TYPE_CHECKING:
    from .kernels.launch import TopLogits

# the engine's ``sampler`` values: an ablation switch between the paths (module docstring)
SAMPLERS = ("triton", "triton-row", "torch")


@dataclass
class SampleOutput:
    """Chosen tokens and, when asked, log-probs under the raw model distribution (vLLM's
    default)."""

    next_tokens: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None  # [B] float32
    top_ids: torch.Tensor | None  # [B, max_top_logprobs] int64, descending log-prob
    top_logprobs: torch.Tensor | None  # [B, max_top_logprobs] float32


def _use_kernel(logits: torch.Tensor, args: BatchSamplingArgs, sampler: str) -> bool:
    if not logits.is_cuda or sampler == "torch":
        return False
    from .kernels.row import CAND

    return args.max_top_k <= CAND


def kernel_sample(logits: torch.Tensor, args: BatchSamplingArgs, row_only: bool = False,
                  **sizes: Any) -> tuple[torch.Tensor, torch.Tensor | None, TopLogits | None]:
    """Tokens, raw logsumexp (when log-probs are asked) and the top ``max_top_logprobs`` raw
    logits (when the split path ran) from the Triton kernels; counts the sampled tokens of
    penalised rows. ``row_only``: the row kernel alone (the ``triton-row`` sampler). ``sizes``:
    the kernels' ``block``/``cand``/``chunk``/``cap``, and ``flags_out`` for the rows the row
    kernel finished (tests, bench)."""
    from .kernels.launch import sample_rows

    pen, bias = args.penalties, args.bias
    return sample_rows(
        logits.contiguous(), args.temperatures, *args.filters, args.seeds, args.steps,
        counts=pen.counts if pen else None, count_rows=pen.rows if pen else None,
        penalties=(pen.presence, pen.frequency, pen.repetition) if pen else None,
        bias=bias.bias if bias else None, bias_rows=bias.rows if bias else None,
        bitmask=args.token_bitmask, need_lse=args.need_logprobs,
        top_n=args.max_top_logprobs if args.need_logprobs else 0, row_only=row_only, **sizes,
    )


def _count_tokens(args: BatchSamplingArgs, tokens: torch.Tensor) -> None:
    """Add each sampled token to its row's counts (penalised rows only), on the device."""
    pen = args.penalties
    if pen is not None:
        active = (pen.rows >= 0).to(torch.int32)
        pen.counts.index_put_((pen.rows.clamp(min=0), tokens), active, accumulate=True)


def sample(logits: torch.Tensor, args: BatchSamplingArgs,
           sampler: str = "triton") -> SampleOutput:
    """Pick one token per row of ``logits`` [B, V] (any float dtype); ``sampler`` is one of
    ``SAMPLERS`` (CPU logits always take the torch reference)."""
    plain = args.penalties is None and args.bias is None and args.token_bitmask is None
    if args.all_greedy and plain and not args.need_logprobs:
        return SampleOutput(logits.argmax(dim=-1), None, None, None)  # exact in any dtype
    assert args.temperatures is not None, "argmax_only args of a batch that is not plain greedy"
    top = None
    if _use_kernel(logits, args, sampler):
        tokens, lse, top = kernel_sample(logits, args, row_only=sampler == "triton-row")
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
