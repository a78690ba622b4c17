"""One compile process of ``compile_workers.py``:

    python -m minisgl.warmup.compile_worker ARCH PARENT_PID

reads kernel variants from stdin, one JSON line each (``Variant.to_json``), compiles each into
Triton's cache (``TRITON_CACHE_DIR``, inherited) with its launcher, and answers each with a JSON
line on stdout: null, or the error in one line. It sees no GPU (its parent empties
``CUDA_VISIBLE_DEVICES``: no CUDA context, no device memory); Triton's CUDA driver here answers
the parent GPU's architecture ``ARCH`` (``90``: sm_90). It exits at the end of stdin, or when its
parent is gone.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


def _cuda_driver_for(arch: int) -> None:
    """Triton's CUDA driver without a device: the current one is 0, its stream 0, its
    architecture ``arch`` (only the compiler asks; nothing here launches)."""
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime.driver import driver

    cuda = CudaDriver()
    cuda.get_current_device = lambda: 0
    cuda.get_current_stream = lambda *_: 0
    cuda.get_device_capability = lambda *_: divmod(arch, 10)
    driver.set_active(cuda)


def main(argv: list[str]) -> int:
    arch, parent = int(argv[0]), int(argv[1])
    os.nice(10)  # the server's own processes (scheduler, tokenizer, API) go first
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the compiler prints goes to stderr, not into the answers
    if os.environ.get("TRITON_INTERPRET") != "1":
        _cuda_driver_for(arch)
    from minisgl.warmup.kernels import compile_one
    from minisgl.warmup.variants import Variant

    for line in sys.stdin:
        try:
            error = compile_one(Variant.from_json(json.loads(line)), load=False)
        except Exception as e:  # noqa: BLE001 - a line it cannot read: answered, not fatal
            error = f"{type(e).__name__}: {str(e)[:200]}"
        try:
            answers.write(json.dumps(error) + "\n")
            answers.flush()
        except BrokenPipeError:  # the parent stopped listening (it is shutting down)
            os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
