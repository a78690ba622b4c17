"""What the engine hands the scheduler (``ForwardOutput``) and what it takes from the kernel
warm-up (``CompilingKernels``): value types and seams, apart from the engine's code, so that
their users import no engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from minisgl.sampling import SampleOutput

from .prompt_logprobs import PromptLogprobs


class CompilingKernels(Protocol):
    """The kernel warm-up (``minisgl.warmup.KernelWarmup``), started before the engine: the
    engine waits for the variants its forwards need before it runs one, and says when it is
    built (the rest compile from then on, not beside its graph capture)."""

    def wait_ready(self, timeout: float | None = None) -> bool: ...

    def engine_built(self) -> None: ...

    def known_peaks(self) -> dict[str, int] | None:
        """The activation peaks an earlier start of the same configuration measured
        (``engine/memory.py``: ``forward``, ``tower``), from the kernel cache; None if none."""
        ...

    def keep_peaks(self, peaks: dict[str, int]) -> None:
        """Keep the peaks just measured for the next start."""
        ...


@dataclass
class ForwardOutput:
    """What one forward hands back to the scheduler: one row per sampled request.

    The host copies are started without waiting; ``wait()`` before reading them.
    """

    next_tokens: torch.Tensor  # [B] int64, on the CPU (valid after wait())
    # device tensors, including log-probabilities when asked; a greedy batch sampled inside a CUDA
    # graph gives the graph's static tokens, valid until the next forward
    sample: SampleOutput
    logits: torch.Tensor  # [B, vocab] on the device (for tests and debugging)
    # host copies of the sample's log-probs (and its top ids and log-probs, when asked)
    logprobs: tuple[torch.Tensor | None, ...] | None = None
    copy_done: torch.cuda.Event | None = None
    prompt_logprobs: PromptLogprobs | None = None  # host copies (echo, logprob_start_len)
    # the MTP method (``EngineConfig.mtp``): every computed token's hidden state (device); EAGLE-3
    # (``draft_model_path``): its captured aux states; and per request of the batch (req, first
    # position, tokens), taken at launch
    hidden: tuple[torch.Tensor, list] | None = None

    def wait(self) -> None:
        if self.copy_done is not None:
            self.copy_done.synchronize()
