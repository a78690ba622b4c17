"""The kernel variants of an engine: its warm-up plan run on a ``ShadowEngine``, split into what
must be compiled before the server reports ready and what may follow.

``KernelSet.essential``: everything the forwards reach (every prefill, mixed and decode shape of
the plan, the decode graphs of every captured batch size with their in-graph greedy sampling) and
what loading the model launches; ``KernelSet.stages[k]``: the sampler variants that stage k + 1 of
``plan.FEATURE_STAGES`` adds. Deterministic for a configuration and a GPU.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import torch

from minisgl.engine.config import EngineConfig
from minisgl.utils import init_logger

from .plan import FEATURE_STAGES, ForwardShape, KernelPlan, kernel_plan
from .probe import ShadowEngine
from .shadow import ShadowTarget, shadow_mode
from .variants import Recording, Variant, record_launches

logger = init_logger(__name__)


@dataclass
class KernelSet:
    essential: list[Variant] = field(default_factory=list)
    stages: list[list[Variant]] = field(default_factory=list)  # one per FEATURE_STAGES entry
    autotuned: list[str] = field(default_factory=list)  # compiled on first use (their timing)
    failed: list[str] = field(default_factory=list)  # probes that did not run to their end

    @property
    def all(self) -> list[Variant]:
        return [*self.essential, *(v for stage in self.stages for v in stage)]

    def to_json(self) -> str:
        return json.dumps({"essential": [v.to_json() for v in self.essential],
                           "stages": [[v.to_json() for v in s] for s in self.stages],
                           "autotuned": self.autotuned, "failed": self.failed})

    @classmethod
    def from_json(cls, text: str) -> KernelSet:
        d = json.loads(text)
        return cls([Variant.from_json(v) for v in d["essential"]],
                   [[Variant.from_json(v) for v in s] for s in d["stages"]],
                   d["autotuned"], d["failed"])

    def summary(self) -> str:
        kernels = len({v.kernel for v in self.all})
        return (f"{len(self.essential)} variants before ready, "
                f"{sum(map(len, self.stages))} after ({kernels} kernels)")


def plan_for(engine: ShadowEngine, grammar: bool) -> KernelPlan:
    config = engine.config
    return kernel_plan(
        max_forward_tokens=config.max_forward_tokens, max_seq_len=engine.max_seq_len,
        max_running_reqs=config.max_running_reqs,
        graph_max_bs=engine.graph_sizes[-1] if engine.graph_sizes else 0,
        piecewise_max_tokens=engine.piecewise.max_tokens if engine.piecewise else 0,
        page_size=config.page_size, grammar=grammar)


def discover(config: EngineConfig, grammar: bool,
             target: ShadowTarget | None = None) -> KernelSet:
    """Run the plan of ``config`` in a shadow engine (``grammar``: requests can carry one).
    A probe that fails is logged and skipped: its kernels then compile on first use."""
    start = time.perf_counter()
    out = KernelSet()
    with shadow_mode(target, torch.device("cuda", config.device.index or 0)) as loading:
        engine = ShadowEngine(config)
        plan = plan_for(engine, grammar)
        forwards = Recording()
        shapes = list(plan.forwards) + _split_counts(engine, plan)
        probes = [(s.name, lambda s=s: engine.forward(s)) for s in shapes]
        probes += [(f"decode graph {bs}", lambda bs=bs: engine.graph_decode(bs))
                   for bs in engine.graph_sizes]
        probes.append(("page-table update", engine.update_tables))
        _run(probes, forwards, out.failed)
        seen = loading.variants | forwards.variants
        out.essential = sorted(seen)
        stages = [Recording() for _ in FEATURE_STAGES]
        for case in plan.sampler_cases:
            # two rows: the kernels' batched paths
            _run([(f"sampler {case.name}", lambda c=case: engine.sample([c.params] * 2))],
                 stages[case.stage - 1], out.failed)
        for rec in stages:
            out.stages.append(sorted(rec.variants - seen))
            seen |= rec.variants
        out.autotuned = sorted(loading.autotuned | forwards.autotuned
                               | {a for r in stages for a in r.autotuned})
    logger.info("kernel plan: %s, found in %.1f s%s", out.summary(),
                time.perf_counter() - start,
                f" ({len(out.failed)} probes failed: {'; '.join(out.failed)})" if out.failed
                else "")
    return out


def _split_counts(engine: ShadowEngine, plan: KernelPlan) -> list[ForwardShape]:
    """Eager decode batches for the decode attention's split counts (a compile-time size) that
    neither the graphs' batch sizes nor the plan's decode rows reach: a mixed step's decode rows
    take the count of their number, any up to ``max_running_reqs``."""
    splits = getattr(engine.attn_backend, "num_splits", None)
    if splits is None:
        return []
    covered = {splits(bs) for bs in engine.graph_sizes}
    covered |= {splits(f.decode) for f in plan.forwards if f.decode}
    extra = []
    for bs in range(1, engine.config.max_running_reqs + 1):
        count = splits(bs)
        if count not in covered:
            covered.add(count)
            extra.append(ForwardShape(decode=bs))
    return extra


def _run(probes, into: Recording, failed: list[str]) -> None:
    for name, probe in probes:
        with record_launches(into):
            try:
                probe()
            except Exception as e:  # noqa: BLE001 - a probe's kernels then compile on first use
                failed.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
