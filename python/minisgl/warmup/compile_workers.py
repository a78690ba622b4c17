"""Compiling kernel variants in processes of their own, ahead of the server's own pass.

Triton's compiler leaves the GIL only in its MLIR, LLVM and ptxas stages; the rest (the kernel's
AST to TTIR, the launcher's build) is Python, and on threads of the server's process it held the
GIL against the engine's start-up and the warm-up's requests (docs/performance.md, "The first
minute"). A variant compiled in another process lands in Triton's cache directory, where the
server's pass (``kernels.compile_one`` on its threads) then finds it: a cache hit, no compiling.

``CompileWorkers`` runs ``n`` processes (``compile_worker.py``: plain subprocesses, since a
scheduler is a daemonic process and may not start ``multiprocessing`` children), each driven by
a thread of its own that hands it the next variant of one queue, in the order submitted, so the
variants needed before ready go first. They run at a lower priority (``nice`` 10): the server's
own processes, serving by then, go first. Nothing depends on them: a variant a process failed to
compile (or that was left when the processes died) is compiled by the server's pass as before.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Callable

from .variants import Variant

_STOP = None


class CompileWorkers:
    """``n`` compile processes for a GPU of architecture ``arch`` (``90``: sm_90; 0 under the
    interpreter), started at once: their imports run beside whatever the caller does next."""

    def __init__(self, n: int, arch: int) -> None:
        # the directory minisgl is imported from (python/ of a checkout), for the processes too
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
               "PYTHONPATH": root + (os.pathsep + path if path else "")}
        self._queue: queue.Queue[tuple[Variant, Future[str | None]] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._procs = [subprocess.Popen(
            [sys.executable, "-m", "minisgl.warmup.compile_worker", str(arch), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
            for _ in range(n)]
        self._alive = n
        self._threads = [threading.Thread(target=self._drive, args=(proc,), daemon=True,
                                          name=f"compile-worker-{i}")
                         for i, proc in enumerate(self._procs)]
        for thread in self._threads:
            thread.start()

    def submit(self, variants: list[Variant]) -> list[Future[str | None]]:
        """Each variant queued behind those submitted before; its future's result is None or the
        process's error in one line."""
        futures = []
        for variant in variants:
            future: Future[str | None] = Future()
            futures.append(future)
            with self._lock:
                if self._alive == 0:
                    future.set_result("the compile processes are gone")
                    continue
                self._queue.put((variant, future))
        return futures

    def _drive(self, proc: subprocess.Popen) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        while (item := self._queue.get()) is not _STOP:
            variant, future = item
            try:
                proc.stdin.write(json.dumps(variant.to_json()) + "\n")
                proc.stdin.flush()
                answer = proc.stdout.readline()
                if not answer:
                    raise EOFError(f"compile process exited (code {proc.poll()})")
                future.set_result(json.loads(answer))
            except (OSError, EOFError, ValueError) as e:
                future.set_result(f"{variant.short_name}: {type(e).__name__}: {e}")
                break
        with self._lock:  # the last one out answers what is left, so no waiter hangs
            self._alive -= 1
            if self._alive == 0:
                self._answer_queued(lambda variant: "the compile processes are gone")

    def cancel(self) -> None:
        """Answer every variant not yet handed to a process with "cancelled" (those being
        compiled finish)."""
        self._answer_queued(lambda variant: f"{variant.short_name}: cancelled")

    def _answer_queued(self, answer: Callable[[Variant], str]) -> None:
        """Answer every variant still queued with ``answer(variant)``; a close's stops stay
        queued."""
        stops = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stops += 1
            else:
                item[1].set_result(answer(item[0]))
        for _ in range(stops):
            self._queue.put(_STOP)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the processes once the queue is done (each ends at the end of its stdin)."""
        for _ in self._procs:
            self._queue.put(_STOP)
        for thread in self._threads:
            thread.join(timeout)
        for proc in self._procs:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
            finally:
                if proc.stdout is not None:
                    proc.stdout.close()
