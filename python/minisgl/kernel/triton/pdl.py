"""Programmatic dependent launch (PDL, Hopper and later) for the kernels of a decode step.

A decode step is a chain of short kernels (norm, GEMV, RoPE, attention, GEMV, ...), and normally
each one is launched only after the one before it has finished, so every kernel pays its launch and
its programs' start-up while the GPU drains. A kernel launched with PDL may be scheduled while its
predecessor is still running; ``griddepcontrol.wait`` then blocks its programs until the
predecessor has completed and its writes are visible.

Every PDL kernel here waits before its first access to another kernel's output and then lets its
own successor launch (``griddepcontrol.launch_dependents``): ``wait_then_release`` as the first
statement, or (the W8A8 GEMM) ``wait`` first and ``release`` after the main loop. What overlaps is
the launch and the programs' start-up, never a memory access, so correctness does not depend on
the overlap.
Measured on an H100 (Qwen3-8B, batch 1): 1.6% (bf16) and 2.9-3.8% (FP8 weights) per token. Asking
L2 for a GEMV's weight rows before its wait (``prefetch.global.L2``) lost 2-4% and was dropped; a
GEMV loading its first weight chunk into registers before the wait (weights are never written, so
that load needs no wait) gains 2-3%: FP8 3.35-3.37 against 3.43-3.55 ms, bf16 5.50 against 5.62
(``gemv.py``, ``fp8_gemv.py``). Two chunks before the wait: 3.49-3.51. The batched FP8 kernels
(per-token quantization, the W8A8 GEMM) releasing their successors at once made the offline run
slower (``fp8`` 1.166x ``default`` against 1.209x): the GEMM's early CTAs hold shared memory while
they wait. The W8A8 GEMM alone, releasing after its main loop (``wait`` ... ``release``), so its
successor launches during its epilogue and tail: 1.233x / 1.234x against 1.224x / 1.222x (two
runs, either order; ``benchmark/results/s12_2026-11-24``). The quantization kernel releasing at
once (one wave of programs without shared memory) lets the GEMM after it become resident and ask
L2 for its first weight tiles before its wait (``fp8_w8a16.PREFETCH_STEPS``): with both, 1.308x-
1.312x against 1.301x-1.306x (``benchmark/results/s20_2026-11-26``).

Kernels launched by others (cuBLAS, torch, NCCL) are ordinary predecessors: a PDL kernel after one
waits for its completion like any kernel. CUDA-graph capture keeps the launches' programmatic edges.
``MINISGL_PDL=0`` turns it off; the interpreter and GPUs before Hopper never use it.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from minisgl.env import PDL


@functools.cache
def _supported(device: int) -> bool:
    return os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.get_device_capability(device)[0] >= 9


def pdl_enabled(x: torch.Tensor) -> bool:
    """Whether kernels launched on ``x``'s device use PDL (read at every launch: benchmarks switch
    ``MINISGL_PDL`` between runs in one process)."""
    return x.is_cuda and PDL.get() != "0" and _supported(x.device.index or 0)


def launch_options(x: torch.Tensor) -> dict:
    """Keyword arguments of a Triton launch: the kernel's ``USE_PDL`` and, when on, ``launch_pdl``
    (left out otherwise, so the interpreter never sees it)."""
    on = pdl_enabled(x)
    return {"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False}


@triton.jit
def wait(USE_PDL: tl.constexpr):
    """Wait for the predecessor's completion (and its writes); ``release`` comes later."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release(USE_PDL: tl.constexpr):
    """Let the successor launch (its programs then wait in ``wait``)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_then_release(USE_PDL: tl.constexpr):
    """Wait for the predecessor's completion (and its writes), then let the successor launch."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

