"""Weights pulled into L2 while the GPU's memory is idle: one-token decode's attention window.

A batch-1 decode step streams every weight once, and the GEMVs that read them run at ~2.6-3.0 TB/s.
Between the QKV and the o projection, though, the RoPE/KV-store kernel and the two attention stages
read a few hundred KB of KV (a short context) and leave HBM idle for several microseconds per
layer. ``prefetch_l2`` spends that window: a small kernel, launched right after the QKV GEMV, asks
L2 for whole weight tensors (the o projection's, then the head of gate-up's) with Hopper's bulk
prefetch (``cp.async.bulk.prefetch.L2.global``: one instruction per ``CHUNK`` bytes, handed to the
copy engine, no registers held, no completion to wait for), so those GEMVs then read L2.

Correctness never depends on it: a prefetch moves no value, only where a later load finds it.
Its programs issue their prefetches, let the next kernel launch (PDL), then wait for the QKV GEMV
before they exit, so the kernels after it still see every write before theirs (``pdl.py``).
On where it runs: CUDA on sm_90+ and not the interpreter (``pdl._supported``); ``MINISGL_PREFETCH=0``
turns it off for ablations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.env import PREFETCH

from . import pdl
from .pdl import release, wait

CHUNK = 16384  # bytes per prefetch instruction
LANES = 32  # prefetches per program: one per thread of its single warp


@triton.jit
def _prefetch_l2(ptr, nbytes, first, CHUNK: tl.constexpr, LANES: tl.constexpr,
                 BULK: tl.constexpr):
    """L2 prefetches of ``[ptr, ptr + nbytes)``: this program's ``LANES`` chunks, counting
    programs from ``first``. ``BULK``: one bulk prefetch per chunk; else one per 128-byte line."""
    offs = ((tl.program_id(0) - first) * LANES + tl.arange(0, LANES)).to(tl.int64) * CHUNK
    if BULK:
        size = tl.minimum(nbytes - offs, CHUNK).to(tl.int32)  # <= 0 past the end: no prefetch
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
            "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1)
    else:
        lines = offs[:, None] + tl.arange(0, CHUNK // 128)[None, :] * 128
        ok = (lines < nbytes).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; "
            "@p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptr + lines, ok], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_kernel(a_ptr, a_bytes, a_programs, b_ptr, b_bytes,
                     CHUNK: tl.constexpr, LANES: tl.constexpr, BULK: tl.constexpr,
                     USE_PDL: tl.constexpr):
    # the first ``a_programs`` programs cover tensor a, the rest tensor b
    if tl.program_id(0) < a_programs:
        _prefetch_l2(a_ptr, a_bytes, 0, CHUNK, LANES, BULK)
    else:
        _prefetch_l2(b_ptr, b_bytes, a_programs, CHUNK, LANES, BULK)
    release(USE_PDL)
    wait(USE_PDL)  # exit only once the kernel before has: the chain's order holds through this one


def prefetch_enabled(x: torch.Tensor) -> bool:
    """Whether ``prefetch_l2`` does anything for tensors on ``x``'s device."""
    return (x.is_cuda and PREFETCH.get() != "0" and pdl._supported(x.device.index or 0))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def prefetch_l2(*tensors: torch.Tensor, bulk: bool = True, pdl_chain: bool = True) -> None:
    """Ask L2 for the bytes of one or two contiguous CUDA tensors (a no-op where
    ``prefetch_enabled`` is false). Each tensor's length is cut to a multiple of 16 bytes."""
    assert 1 <= len(tensors) <= 2
    if not prefetch_enabled(tensors[0]):
        return
    spans = []
    for t in tensors:
        assert t.is_contiguous() and t.data_ptr() % 16 == 0, "bulk prefetch needs 16-byte alignment"
        spans.append((t, t.numel() * t.element_size() // 16 * 16))
    a, a_bytes = spans[0]
    b, b_bytes = spans[1] if len(spans) == 2 else (a, 0)
    per = LANES * CHUNK
    a_programs, b_programs = triton.cdiv(a_bytes, per), triton.cdiv(b_bytes, per)
    _prefetch_kernel[(a_programs + b_programs,)](
        _bytes(a), a_bytes, a_programs, _bytes(b), b_bytes,
        CHUNK=CHUNK, LANES=LANES, BULK=bulk, num_warps=1,
        **(pdl.launch_options(a) if pdl_chain else {"USE_PDL": False}))
