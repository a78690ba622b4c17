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
On an H100 (Qwen3-8B, batch 1) PDL saves 1.6% (bf16) and 2.9-3.8% (FP8 weights) per token. A GEMV
loads its first weight chunk into registers before the wait (weights are never written, so that
load needs no wait): 2-3% more (``gemv.py``, ``fp8_gemv.py``); one chunk, since two lose it again.
The W8A8 GEMM of batched FP8 decode releases its successor only after its main loop (its early
CTAs would hold shared memory while they wait), so the successor launches during its epilogue; the
per-token quantization before it releases at once (one wave, no shared memory), so the GEMM is
resident and asks L2 for its first weight tiles before its wait (``fp8_w8a16.PREFETCH_STEPS``).

Kernels launched by others (cuBLAS, torch, NCCL) are ordinary predecessors: a PDL kernel after one
waits for its completion like any kernel. CUDA-graph capture keeps the launches' programmatic edges.
Every launcher takes ``pdl`` from its caller (the engine's ``pdl``, off with ``disable_pdl``); the
interpreter and GPUs before Hopper never use it.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.cache
def hopper_compiled(device: int) -> bool:
    """Whether kernels launched on CUDA ``device`` are compiled (not interpreted) for Hopper or
    later: what PDL and inline PTX of sm_90 need."""
    return (os.environ.get("TRITON_INTERPRET") != "1"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def pdl_enabled(x: torch.Tensor, pdl: bool) -> bool:
    """Whether a kernel launched on ``x``'s device uses PDL: asked for (``pdl``) and supported."""
    return pdl and x.is_cuda and hopper_compiled(x.device.index or 0)


def launch_options(x: torch.Tensor, pdl: bool) -> dict:
    """Keyword arguments of a Triton launch: the kernel's ``USE_PDL`` and, when on, ``launch_pdl``
    (left out otherwise, so the interpreter never sees it)."""
    on = pdl_enabled(x, pdl)
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

