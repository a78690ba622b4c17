"""Compiling an engine's kernel variants on every CPU core, beside its start-up.

``KernelWarmup.start`` returns at once; a thread of its own finds the variants (``discover``: a
shadow run, CPU only) and compiles them on a pool of threads, while the engine loads its weights.
When it had to find them (a new cache), or the last warm-up with its plan did not finish, the
sampler's variants compile first in processes of their own (``compile_workers.py``) while the
engine profiles its memory and captures its graphs: Triton's Python stages hold the GIL, and on
threads they held it against the engine and the warm-up's requests; the threads' pass over them
then finds cache hits (a restart's whole work).
The engine waits (``wait_ready``) for the variants its forwards need before it profiles memory
and captures CUDA graphs, so no capture compiles anything; the sampler's variants follow stage by
stage (``plan.FEATURE_STAGES``) while the server already serves: ``stage`` is the number of
stages done, ``warming`` says what is left.

Each variant compiles once: Triton writes it to its cache (``TRITON_CACHE_DIR``), where a restart,
or another machine given the directory (``python -m minisgl warmup --cache-dir``), finds it.
Triton's compiler releases the GIL in its MLIR, LLVM and ptxas stages, so threads compile in
parallel; a variant that fails to compile here is logged and compiles on first use instead.
Triton also builds a C launcher per variant with the host's compiler and loads the module on its
first launch: the threads do both for the variants needed before ready, and build the launchers
(not the modules: the engine may be capturing graphs) of the rest.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from minisgl.engine.config import EngineConfig
from minisgl.utils import init_logger, usable_cpus

from .compile_workers import CompileWorkers
from .discover import KernelSet, discover
from .plan import FEATURE_STAGES
from .variants import Variant

logger = init_logger(__name__)


def compile_workers(tp_size: int = 1) -> int:
    """The threads one rank compiles on: its share of this machine's cores."""
    return max(1, usable_cpus() // max(1, tp_size))


def _prepare_launch(kernel, load: bool) -> None:
    """Triton builds each variant's launcher (C, with the host's compiler) and loads its module
    on the first launch: do that here. ``load=False``: only the launcher, into the cache (a module
    load while another thread captures a CUDA graph would break the capture)."""
    if load and hasattr(kernel, "_init_handles"):
        kernel._init_handles()
    elif hasattr(kernel, "src") and hasattr(kernel, "metadata"):
        from triton.runtime.driver import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)  # type: ignore[attr-defined]


def compile_pool(workers: int, device: torch.device) -> ThreadPoolExecutor:
    """The threads ``compile_variants`` compiles on, each with ``device`` as its current one."""
    return ThreadPoolExecutor(workers, thread_name_prefix="triton-compile",
                              initializer=torch.cuda.set_device, initargs=(device,))


def compile_one(variant: Variant, load: bool = True) -> str | None:
    """Compile ``variant`` for this thread's device (no launch) with its launcher, and with
    ``load`` its module loaded; its error in one line, if any (it then compiles on first use)."""
    try:
        kernel = variant.compile()
        if kernel is not None:  # None: the interpreter
            _prepare_launch(kernel, load)
    except Exception as e:  # noqa: BLE001 - compiled on first use instead
        return f"{variant.short_name}: {type(e).__name__}: {str(e)[:200]}"
    return None


def make_device_caches(variants: list[Variant]) -> None:
    """Each kernel's cache for this thread's device, made here once (threads that made it at
    once would each keep their own, and lose all but one)."""
    from .variants import _kernel_by_name

    index = torch.cuda.current_device()
    for name in {v.kernel for v in variants}:
        try:
            kernel = _kernel_by_name(name)
        except (ImportError, AttributeError):  # a plan older than the code: ``compile_one`` says
            continue
        caches = getattr(kernel, "device_caches", None)  # None: the interpreter
        if caches is not None:
            _ = caches[index]


def compile_variants(variants: list[Variant], pool: ThreadPoolExecutor,
                     load: bool = True) -> list[Future[str | None]]:
    """``compile_one`` of each of ``variants`` queued on ``pool`` (``compile_pool``), in order."""
    make_device_caches(variants)
    return [pool.submit(compile_one, v, load) for v in variants]


_CLOSE_S = 10.0  # how long ``close`` waits for the variants compiling to finish


class KernelWarmup:
    """The kernel variants of the engine of ``config``, compiled on ``workers`` threads.
    ``grammar``: requests may carry a grammar (the sampler's mask variants are needed);
    ``kernels``: a set found before (the kernel cache's plan), else a shadow run finds it and
    hands it to ``on_found``. ``peaks``: the activation peaks that size the KV pool
    (``engine/memory.py``) as the kernel cache kept them, and ``on_peaks`` where newly measured
    ones go. ``finished_before``: whether a warm-up with this plan ran to its end before (if not,
    the sampler's stages may still need compiling: in processes, as on a new cache; default:
    a plan was given); ``on_done`` is told when this one does."""

    def __init__(self, config: EngineConfig, grammar: bool, workers: int | None = None,
                 kernels: KernelSet | None = None,
                 on_found: Callable[[KernelSet], None] = lambda _: None, *,
                 peaks: dict[str, int] | None = None,
                 on_peaks: Callable[[dict[str, int]], None] = lambda _: None,
                 finished_before: bool | None = None,
                 on_done: Callable[[], None] = lambda: None) -> None:
        self.config, self.grammar, self.on_found = config, grammar, on_found
        self.peaks, self.on_peaks, self.on_done = peaks, on_peaks, on_done
        self.finished_before = kernels is not None if finished_before is None else finished_before
        self.workers = workers or compile_workers(config.tp.size)
        self.kernels = kernels
        self.stage = 0  # sampler stages compiled (``plan.FEATURE_STAGES``)
        self.compiled = 0
        self.total = 0
        self.errors: list[str] = []
        self._ready = threading.Event()
        self._built = threading.Event()  # the engine's start-up is over (``engine_built``)
        self._done = threading.Event()
        self._stop = threading.Event()  # its scheduler is gone (``close``)
        self._thread: threading.Thread | None = None
        self._workers: CompileWorkers | None = None
        self._lock = threading.Lock()

    def start(self) -> KernelWarmup:
        self._thread = threading.Thread(target=self._run, name="kernel-warmup", daemon=True)
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the variants needed before ready are compiled (or the attempt failed)."""
        return self._ready.wait(timeout)

    def engine_built(self) -> None:
        """The engine is built (weights, memory profile, CUDA graphs): the sampler's stages may
        compile now (beside the start-up, their compiles' Python held the GIL against its graph
        capture: docs/performance.md, "The first minute")."""
        self._built.set()

    def known_peaks(self) -> dict[str, int] | None:
        return self.peaks

    def keep_peaks(self, peaks: dict[str, int]) -> None:
        self.peaks = peaks
        try:
            self.on_peaks(peaks)
        except OSError as e:  # a read-only cache: measured again next time
            logger.warning("kernel cache: the activation peaks not kept (%s)", e)

    def close(self, timeout: float = _CLOSE_S) -> None:
        """Stop, its scheduler gone: what is compiling finishes, nothing queued starts, the
        compile processes end (a warm-up waiting for the engine's start-up stops waiting)."""
        self._stop.set()
        self._built.set()
        if self._workers is not None:
            self._workers.cancel()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_all(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def warming(self) -> str:
        """What is still compiling, in words; "" when nothing is."""
        if self._done.is_set():
            return ""
        if not self._ready.is_set():
            what = "finding the kernel variants" if self.total == 0 else "kernels before ready"
            return f"{what}: {self.compiled} of {self.total} compiled"
        left = ", ".join(FEATURE_STAGES[self.stage:])
        return f"sampler kernels ({left}): {self.compiled} of {self.total} compiled"

    def _run(self) -> None:
        device = self.config.device
        torch.cuda.set_device(device)
        workers = self._workers = (None if self.finished_before and self.kernels is not None
                                   else self._start_workers())
        try:
            with compile_pool(self.workers, device) as pool:
                self._stages(pool, workers)
        finally:
            if workers is not None:
                workers.close()

    def _start_workers(self) -> CompileWorkers | None:
        """Compile processes, started before the shadow run (their imports take seconds, beside
        it); one core is left to the engine. None where they cannot start (the threads compile
        everything)."""
        try:
            interpret = os.environ.get("TRITON_INTERPRET") == "1"
            major, minor = (0, 0) if interpret else torch.cuda.get_device_capability(
                self.config.device)
            return CompileWorkers(max(1, self.workers - 1), 10 * major + minor)
        except Exception as e:  # noqa: BLE001 - the threads compile everything instead
            logger.warning("kernel warm-up: no compile processes (%s: %s)", type(e).__name__, e)
            return None

    def _stages(self, pool: ThreadPoolExecutor, workers: CompileWorkers | None) -> None:
        ahead: list[list[Future[str | None]]] = []  # the processes' work, a list a stage
        try:
            if self.kernels is None:
                self.kernels = discover(self.config, self.grammar)
                if not self.kernels.failed:  # a plan with gaps is found again next time
                    self.on_found(self.kernels)
            self.total = len(self.kernels.all)
            self._wait(compile_variants(self.kernels.essential, pool, load=True), "before ready")
            if workers is not None:  # from here on the engine holds the GIL: not the compilers
                ahead = [workers.submit(stage) for stage in self.kernels.stages]
        except Exception as e:  # noqa: BLE001 - the engine then compiles on first use
            logger.warning("kernel warm-up failed (kernels compile on first use): %s: %s",
                           type(e).__name__, e)
            self._done.set()
            return
        finally:
            self._ready.set()
        # once the engine is built, every stage queued at once, in order (all cores busy); a
        # stage is done when its variants and those of the stages before are; no module loads
        # here (the engine's thread loads on first use). With the processes, a stage's pass
        # here follows theirs and takes cache hits: the stage is done then, before the next
        # stage's processes finish (its requests wait no longer than its own compiles)
        self._built.wait()
        queued: list[list[Future[str | None]]] = []
        for k, stage in enumerate(self.kernels.stages):
            if ahead and not self._stop.is_set():
                self._wait_processes(ahead[k], f"sampler stage {FEATURE_STAGES[k]}")
            if self._stop.is_set():
                break
            queued.append(compile_variants(stage, pool, load=False))
            if ahead:
                self._finish_stage(k, queued[k])
        if self._stop.is_set():  # the variants compiling now finish, no other starts
            if workers is not None:
                workers.cancel()
            pool.shutdown(cancel_futures=True)
            self._done.set()
            logger.info("kernel warm-up stopped (its scheduler closed): %d variants compiled",
                        self.compiled)
            return
        for k in range(self.stage, len(queued)):
            self._finish_stage(k, queued[k])
        self._done.set()
        logger.info("kernel warm-up done: %d variants compiled or loaded, %d failed "
                    "(compiled on first use)", self.compiled, len(self.errors))
        try:
            self.on_done()
        except OSError as e:  # a read-only cache: the next start compiles as if it were new
            logger.warning("kernel cache: the warm-up's end not recorded (%s)", e)

    def _finish_stage(self, k: int, futures: list[Future[str | None]]) -> None:
        self._wait(futures, f"sampler stage {FEATURE_STAGES[k]}")
        self.stage = k + 1

    def _wait_processes(self, futures: list[Future[str | None]], what: str) -> None:
        """Wait for the processes' share of a step; what they failed, this process compiles."""
        start = time.perf_counter()
        failed = [error for f in futures if (error := f.result()) is not None]
        logger.info("kernel variants (%s): %d compiled in processes, %.1f s%s", what,
                    len(futures) - len(failed), time.perf_counter() - start,
                    f"; {len(failed)} left to this process: {failed[0]}" if failed else "")

    def _wait(self, futures: list[Future[str | None]], what: str) -> None:
        start = time.perf_counter()
        errors = []
        for f in futures:
            error = f.result()
            if error is not None:
                errors.append(error)
            with self._lock:
                self.compiled += 1
        self.errors += errors
        logger.info("kernel variants (%s): %d ready on %d threads, %.1f s%s", what, len(futures),
                    self.workers, time.perf_counter() - start,
                    f"; {len(errors)} failed (compiled on first use): {errors[0]}" if errors
                    else "")
