"""The kernel warm-up's schedule, with the compilation itself stood in by the interpreter (CPU):
the variants needed before ready first, then, once the engine is built, the sampler's stages in
order, each done when its variants and those before are; what is left said in words; a failure
never stops the engine."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from minisgl.engine import EngineConfig
from minisgl.warmup import kernels as kernels_mod
from minisgl.warmup.discover import KernelSet
from minisgl.warmup.kernels import KernelWarmup
from minisgl.warmup.plan import FEATURE_STAGES
from minisgl.warmup.variants import Variant

SILU = "minisgl.kernel.triton.activation:_silu_and_mul_kernel"


def _variant(block: int) -> Variant:
    return Variant(SILU, (("ptr", "float32", True), ("ptr", "float32", True), ("int", "any32"),
                          ("int", "any32"), ("int", "any32"), ("const", block)))


@pytest.fixture
def no_device(monkeypatch):
    """The device calls of a GPU's warm-up, answered on a CPU."""
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def _config() -> EngineConfig:
    return EngineConfig(model_path="unused", device=torch.device("cuda", 0), dtype=torch.float16)


def test_stages_follow_the_variants_before_ready(no_device, monkeypatch):
    gate = threading.Event()
    seen: list[int] = []

    def compile_one(variant: Variant, load: bool = True) -> str | None:
        block = variant.args[-1][1]
        if block >= 100:  # the sampler's stages wait for the test
            gate.wait(10)
        seen.append(block)
        return "boom" if block == 103 else None

    monkeypatch.setattr(kernels_mod, "compile_one", compile_one)
    stages = [[_variant(100 + k)] for k in range(len(FEATURE_STAGES))]
    plan = KernelSet([_variant(1), _variant(2)], stages, [], [])
    warm = KernelWarmup(_config(), grammar=True, workers=2, kernels=plan).start()
    assert warm.wait_ready(10) and sorted(seen[:2]) == [1, 2]
    gate.set()
    assert not warm.wait_all(0.5)  # the sampler's stages wait for the engine's start-up
    assert sorted(seen) == [1, 2]
    assert not warm.done and warm.stage == 0
    assert warm.warming().startswith("sampler kernels (sampled, logprobs")
    warm.engine_built()
    assert warm.wait_all(10) and warm.stage == len(FEATURE_STAGES)
    assert warm.warming() == "" and warm.compiled == 2 + len(FEATURE_STAGES)
    assert warm.errors == ["boom"]  # logged; that variant compiles on first use


def test_a_failed_shadow_run_lets_the_engine_start(no_device, monkeypatch):
    def fail(config, grammar):
        raise RuntimeError("no")

    monkeypatch.setattr(kernels_mod, "discover", fail)
    found = []
    warm = KernelWarmup(_config(), grammar=False, workers=1, on_found=found.append).start()
    assert warm.wait_ready(10) and warm.wait_all(10) and warm.done
    assert warm.kernels is None and warm.warming() == "" and not found


def test_a_found_plan_is_handed_on_and_compiled(no_device, monkeypatch):
    plan = KernelSet([_variant(4)], [[] for _ in FEATURE_STAGES], [], [])
    monkeypatch.setattr(kernels_mod, "discover", lambda config, grammar: plan)
    found = []
    warm = KernelWarmup(_config(), grammar=False, workers=1, on_found=found.append).start()
    warm.engine_built()
    assert warm.wait_all(10) and found == [plan] and warm.compiled == 1 and not warm.errors


def test_a_new_cache_compiles_the_stages_in_processes_first(no_device, monkeypatch, caplog):
    """With no plan, compile processes start beside the shadow run and, once the variants needed
    before ready are compiled here, take the sampler's stages first, in order (the interpreter
    stands in for Triton's compiler there); this process's pass over a stage follows theirs and
    compiles what they could not; none of them is left behind."""
    import psutil

    bogus = Variant("minisgl.kernel.triton.activation:not_a_kernel", ())
    stages = [[_variant(100 + k)] for k in range(len(FEATURE_STAGES))]
    stages[2].append(bogus)
    plan = KernelSet([_variant(1)], stages, [], [])
    monkeypatch.setattr(kernels_mod, "discover", lambda config, grammar: plan)
    here: list[Variant] = []

    def compile_one(variant: Variant, load: bool = True) -> str | None:
        here.append(variant)
        return None

    monkeypatch.setattr(kernels_mod, "compile_one", compile_one)
    caplog.set_level("INFO", logger="minisgl.warmup.kernels")
    warm = KernelWarmup(_config(), grammar=True, workers=3).start()
    warm.engine_built()
    assert warm.wait_all(60) and warm.stage == len(FEATURE_STAGES) and not warm.errors
    assert here[0] == _variant(1) and sorted(here) == sorted([_variant(1), *sum(stages, [])])
    assert "(sampler stage sampled): 1 compiled in processes" in caplog.text
    assert "(sampler stage top-logprobs): 1 compiled in processes" in caplog.text
    assert "1 left to this process: not_a_kernel: AttributeError" in caplog.text
    warm._thread.join(10)
    children = psutil.Process().children(recursive=True)
    assert not [p for p in children if "compile_worker" in " ".join(p.cmdline())]


@pytest.mark.parametrize("finished_before", [True, False])
def test_a_plan_whose_warm_up_did_not_finish_compiles_in_processes(no_device, monkeypatch,
                                                                   caplog, finished_before):
    """A kept plan whose last warm-up ended (the cache's mark) compiles its stages on this
    process's threads (cache hits); one whose warm-up stopped before its stages were done starts
    the compile processes, as a new cache does. The end of the warm-up is reported for the
    mark."""
    stages = [[_variant(100 + k)] for k in range(len(FEATURE_STAGES))]
    plan = KernelSet([_variant(1)], stages, [], [])
    monkeypatch.setattr(kernels_mod, "compile_one", lambda variant, load=True: None)
    caplog.set_level("INFO", logger="minisgl.warmup.kernels")
    done = []
    warm = KernelWarmup(_config(), grammar=True, workers=2, kernels=plan,
                        finished_before=finished_before, on_done=lambda: done.append(True))
    warm.start().engine_built()
    assert warm.wait_all(60) and warm.stage == len(FEATURE_STAGES) and not warm.errors
    warm._thread.join(10)
    assert ("compiled in processes" in caplog.text) is not finished_before
    assert done == [True]


def test_a_stage_done_in_processes_is_ready_before_the_later_stages(no_device, monkeypatch):
    """A sampled request waits for the processes' first stage only: while the grammar's
    variants still compile there, the stages the processes have finished count as done."""
    from concurrent.futures import Future

    stages = [[_variant(100 + k)] for k in range(len(FEATURE_STAGES))]
    plan = KernelSet([_variant(1)], stages, [], [])
    monkeypatch.setattr(kernels_mod, "discover", lambda config, grammar: plan)
    monkeypatch.setattr(kernels_mod, "compile_one", lambda variant, load=True: None)
    later: Future[str | None] = Future()

    class Processes:  # the first stage compiled at once, every later one held by the test
        def __init__(self, n: int, arch: int) -> None:
            pass

        def submit(self, variants: list[Variant]) -> list[Future[str | None]]:
            if variants is not stages[0]:
                return [later]
            done: Future[str | None] = Future()
            done.set_result(None)
            return [done]

        def close(self) -> None:
            pass

    monkeypatch.setattr(kernels_mod, "CompileWorkers", Processes)
    warm = KernelWarmup(_config(), grammar=True, workers=2).start()
    warm.engine_built()
    deadline = time.monotonic() + 10
    while warm.stage < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert warm.stage == 1 and not warm.done
    assert warm.warming().startswith("sampler kernels (logprobs, ")
    later.set_result(None)
    assert warm.wait_all(10) and warm.stage == len(FEATURE_STAGES)


def test_a_closed_warm_up_stops_and_its_processes_end(no_device, monkeypatch):
    """Its scheduler closed (or its engine failed to start) before the engine was built: the
    warm-up stops waiting, compiles none of the sampler's stages, and its compile processes
    end; the variants the processes had not started are answered "cancelled"."""
    import psutil

    stages = [[_variant(100 + k)] for k in range(len(FEATURE_STAGES))]
    plan = KernelSet([_variant(1)], stages, [], [])
    monkeypatch.setattr(kernels_mod, "discover", lambda config, grammar: plan)
    here: list[Variant] = []
    monkeypatch.setattr(kernels_mod, "compile_one",
                        lambda variant, load=True: here.append(variant))
    warm = KernelWarmup(_config(), grammar=True, workers=2).start()
    assert warm.wait_ready(60)
    warm.close()
    assert warm._thread is not None and not warm._thread.is_alive()
    assert warm.done and here == [_variant(1)]  # the stages never came to this process
    children = psutil.Process().children(recursive=True)
    assert not [p for p in children if "compile_worker" in " ".join(p.cmdline())]


def test_a_failed_engine_stops_its_warm_up(monkeypatch):
    from minisgl.warmup import start

    closed = []

    class Warmup:
        def close(self):
            closed.append(True)

    def no_engine(config, kernels=None):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(start, "start_kernel_warmup", lambda config: Warmup())
    monkeypatch.setattr(start, "Engine", no_engine)
    with pytest.raises(RuntimeError, match="out of memory"):
        start.engine_with_warmup(_config())
    assert closed == [True]


def test_compile_processes_end_with_their_parent():
    """A server killed while its compile processes work leaves none of them behind."""
    import os
    import subprocess
    import sys
    import time

    import psutil

    code = ("import time; from minisgl.warmup.compile_workers import CompileWorkers\n"
            "w = CompileWorkers(2, 0); print(' '.join(str(p.pid) for p in w._procs), flush=True)\n"
            "time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TRITON_INTERPRET": "1"}
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=env)
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 60
    for pid in pids:
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie":
            assert time.monotonic() < deadline, "a compile process outlived its parent"
            time.sleep(0.2)
