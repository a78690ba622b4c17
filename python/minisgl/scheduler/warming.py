"""Which sampler a batch takes while the sampler's kernels still compile.

After the server reports ready the sampler's Triton variants keep compiling stage by stage
(``minisgl.warmup``: sampled, log-probs, top log-probs, penalties, bias, grammar). A batch
launches the variant of the union of its rows' features; when one of them belongs to a stage
not compiled yet, the batch samples on the torch reference (``sampling/torch_ref.py``) instead,
which needs no compiler and draws the same tokens (the same counter-based uniforms, the same
race: the kernels' tests hold them to it). No request waits for a compiler and no running
stream stalls; the batches move to the kernels as their stages finish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from minisgl.warmup.plan import feature_stage, request_features

if TYPE_CHECKING:
    from minisgl.core import Req

REFERENCE = "torch"  # the sampler of a batch whose kernels still compile


class SamplerStages(Protocol):
    """What the gate reads of the kernel warm-up (``minisgl.warmup.KernelWarmup``)."""

    stage: int  # stages of ``plan.FEATURE_STAGES`` compiled

    @property
    def done(self) -> bool: ...


class WarmingGate:
    """``sampler(reqs)``: the sampler a batch of ``reqs``' rows takes while the kernels compile
    (``stages`` None: no kernel warm-up, everything is compiled)."""

    def __init__(self, stages: SamplerStages | None) -> None:
        self.stages = stages

    def sampler(self, reqs: list[Req]) -> str | None:
        """``REFERENCE`` when a row's kernels still compile; None: the engine's own sampler.
        Every step asks: once the warm-up is done, no row is looked at."""
        s = self.stages
        if s is None or s.done:
            return None
        stage = s.stage
        compiled = all(feature_stage(request_features(r.sampling_params)) <= stage for r in reqs)
        return None if compiled else REFERENCE
