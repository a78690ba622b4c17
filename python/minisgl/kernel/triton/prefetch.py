"""Weights pulled into L2 while HBM is idle: the attention window of one-token decode.

A batch-1 decode step streams every weight once, and the GEMVs that read them run at ~2.6-3.0 TB/s.
Between the QKV and the o projection, though, the RoPE/KV-store kernel and the two attention stages
read a few hundred KB of KV (a short context) and leave HBM idle for several microseconds per
layer. ``prefetch_l2`` spends that window: a small kernel asks L2 for the o projection's weight
with Hopper's bulk prefetch (``cp.async.bulk.prefetch.L2.global``, one instruction per ``CHUNK``
bytes, handed to the copy engine), so the o GEMV then reads L2.

The kernel runs on a side stream, forked after the QKV GEMV: a program that issued bulk prefetches
lives until they land, so in the decode kernels' own stream it held up the RoPE kernel behind it
and lost (Qwen3-8B batch 1 on an H100: FP8 3.51 against 3.42 ms, bf16 7.76 against 5.59; per-line
``prefetch.global.L2`` the same way: 3.51 / 5.85). Beside that stream, joined before the o GEMV:
FP8 3.31 ms, bf16 5.47 (``benchmark/results/s15_2026-11-25``). ``join_prefetches`` joins the side
stream back (a CUDA-graph capture must end joined).

Correctness never depends on it: a prefetch moves no value, only where a later load finds it.
On where it runs: CUDA on sm_90+ and not the interpreter (``pdl._supported``); ``MINISGL_PREFETCH=0``
turns it off for ablations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl.env import PREFETCH

from . import pdl

CHUNK = 4096  # bytes per prefetch instruction
LANES = 32  # prefetches per program: one per thread of its single warp
_SIDE: dict[torch.device, torch.cuda.Stream] = {}
_PENDING: set[torch.device] = set()  # devices whose side stream has work not yet joined


@triton.jit
def _prefetch_l2(ptr, nbytes, first, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Bulk L2 prefetches of ``[ptr, ptr + nbytes)``: this program's ``LANES`` chunks, counting
    programs from ``first``."""
    offs = ((tl.program_id(0) - first) * LANES + tl.arange(0, LANES)).to(tl.int64) * CHUNK
    size = tl.minimum(nbytes - offs, CHUNK).to(tl.int32)  # <= 0 past the end: no prefetch
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_kernel(a_ptr, a_bytes, a_programs, b_ptr, b_bytes,
                     CHUNK: tl.constexpr, LANES: tl.constexpr):
    # the first ``a_programs`` programs cover tensor a, the rest tensor b
    if tl.program_id(0) < a_programs:
        _prefetch_l2(a_ptr, a_bytes, 0, CHUNK, LANES)
    else:
        _prefetch_l2(b_ptr, b_bytes, a_programs, CHUNK, LANES)


def prefetch_enabled(x: torch.Tensor) -> bool:
    """Whether ``prefetch_l2`` does anything for tensors on ``x``'s device."""
    return x.is_cuda and PREFETCH.get() != "0" and pdl._supported(x.device.index or 0)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def prefetch_l2(*tensors: torch.Tensor) -> None:
    """Ask L2 for the bytes of one or two contiguous CUDA tensors, from a side stream forked off
    the current one here (a no-op where ``prefetch_enabled`` is false). Each tensor's length is cut
    to a multiple of 16 bytes. ``join_prefetches`` joins the side stream back."""
    assert 1 <= len(tensors) <= 2
    a = tensors[0]
    if not prefetch_enabled(a):
        return
    spans = []
    for t in tensors:
        assert t.is_contiguous() and t.data_ptr() % 16 == 0, "bulk prefetch needs 16-byte alignment"
        spans.append((t, t.numel() * t.element_size() // 16 * 16))
    a, a_bytes = spans[0]
    b, b_bytes = spans[1] if len(spans) == 2 else (a, 0)
    per = LANES * CHUNK
    a_programs, b_programs = triton.cdiv(a_bytes, per), triton.cdiv(b_bytes, per)
    side = _SIDE.setdefault(a.device, torch.cuda.Stream(a.device))
    side.wait_stream(torch.cuda.current_stream(a.device))
    with torch.cuda.stream(side):
        _prefetch_kernel[(a_programs + b_programs,)](
            _bytes(a), a_bytes, a_programs, _bytes(b), b_bytes, CHUNK=CHUNK, LANES=LANES,
            num_warps=1)
    _PENDING.add(a.device)


def join_prefetches(x: torch.Tensor) -> None:
    """The current stream waits for the prefetches issued on ``x``'s device since the last join
    (if any)."""
    if x.device in _PENDING:
        _PENDING.discard(x.device)
        torch.cuda.current_stream(x.device).wait_stream(_SIDE[x.device])
