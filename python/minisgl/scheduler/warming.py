"""Whether a request's sampler kernels are compiled yet; until they are it does not sample.

After the server reports ready the sampler's variants keep compiling stage by stage
(``minisgl.warmup``: sampled, log-probs, top log-probs, penalties, bias, grammar). A batch
launches the sampler variant of the union of its rows' features, so a request samples only when
every feature it uses belongs to a finished stage: no batch it joins can then need a variant that
is still compiling, and no running stream waits for a compiler. Meanwhile its prompt is
prefilled up to its last token (``PrefillManager``'s ``may_sample``), so the wait costs it the
compilation's remainder at most, not its prefill on top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from minisgl.warmup.plan import feature_stage, request_features

if TYPE_CHECKING:
    from minisgl.core import Req


class SamplerStages(Protocol):
    """What the gate reads of the kernel warm-up (``minisgl.warmup.KernelWarmup``)."""

    stage: int  # stages of ``plan.FEATURE_STAGES`` compiled

    @property
    def done(self) -> bool: ...


class WarmingGate:
    """``admits(req)``: whether every sampler feature ``req`` uses is compiled (``stages`` None:
    no kernel warm-up, everything is)."""

    def __init__(self, stages: SamplerStages | None) -> None:
        self.stages = stages

    def admits(self, req: Req) -> bool:
        s = self.stages
        if s is None or s.done:
            return True
        return feature_stage(request_features(req.sampling_params)) <= s.stage
