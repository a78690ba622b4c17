"""Requests whose sampler kernels are still compiling wait here; every other request runs.

After the server reports ready the sampler's variants keep compiling stage by stage
(``minisgl.warmup``: sampled, log-probs, top log-probs, penalties, bias, grammar). A batch
launches the sampler variant of the union of its rows' features, so a request is admitted only
when every feature it uses belongs to a finished stage: no batch it joins can then need a variant
that is still compiling, and no running stream waits for a compiler. A held request joins the
prefill queue, in arrival order, at the first step after its stage is done.
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
    def __init__(self, stages: SamplerStages | None) -> None:
        self.stages = stages
        self.held: list[Req] = []

    def admits(self, req: Req) -> bool:
        s = self.stages
        if s is None or s.done:
            return True
        return feature_stage(request_features(req.sampling_params)) <= s.stage

    def hold(self, req: Req) -> None:
        self.held.append(req)

    def release(self) -> list[Req]:
        """The held requests that may run now, in arrival order."""
        if not self.held:
            return []
        ready = [r for r in self.held if self.admits(r)]
        if ready:
            self.held = [r for r in self.held if not self.admits(r)]
        return ready

    def remove(self, req: Req) -> bool:
        """Forget ``req``; True if it was held (so it is in no queue)."""
        if req in self.held:
            self.held.remove(req)
            return True
        return False
