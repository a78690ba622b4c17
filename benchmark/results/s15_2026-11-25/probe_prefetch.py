"""Probe (session 15, dropped): one-token decode pulling the o projection's FP8 weight into L2
during the attention window, with Hopper's bulk prefetch on a side stream.

    python benchmark/results/s15_2026-11-25/probe_prefetch.py [--out DIR]

The kernel and its stream handling as they were on the branch of commits adfdc24..aacddf0 (the
model wiring is in those commits), and the layer probe: QKV GEMV, an idle window (a spin kernel),
o GEMV, 36 layers over distinct weights in one CUDA graph, with and without the prefetch, its side
stream joined before the o GEMV (early) or after the last layer (late). See README.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "offline"))

from bench_common import gpu_name  # noqa: E402
from minisgl.kernel.triton.fp8_gemv import fp8_gemv  # noqa: E402
from minisgl.quant import quantize_channel  # noqa: E402

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


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def prefetch_l2(*tensors: torch.Tensor) -> None:
    """Ask L2 for the bytes of one or two contiguous CUDA tensors, from a side stream forked off
    the current one here. Each tensor's length is cut
    to a multiple of 16 bytes. ``join_prefetches`` joins the side stream back."""
    assert 1 <= len(tensors) <= 2
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


LAYERS = 36
HIDDEN, QKV = 4096, 6144


def spin_cycles_per_us() -> float:
    """``torch.cuda._sleep``'s cycles per microsecond on this GPU, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    torch.cuda.synchronize()
    return 2_000_000 / (start.elapsed_time(end) * 1000)


def fp8_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    return quantize_channel(w)


def time_step(layers, x, cycles: int, mode: str) -> float:
    """Microseconds per layer of one graph replay (median of 7). ``mode``: none; early (the side
    stream joined before the o GEMV); late (joined once, after the last layer)."""

    def step():
        h = x
        for (wq, sq), (wo, so) in layers:
            qkv = fp8_gemv(h, wq, sq, None)
            if mode != "none":
                prefetch_l2(wo)
            if cycles:
                torch.cuda._sleep(cycles)
            if mode == "early":
                join_prefetches(h)
            h = fp8_gemv(qkv[:, :HIDDEN].contiguous(), wo, so, None)
        join_prefetches(h)
        return h

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(7):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(layers))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmark/kernels/results")
    args = parser.parse_args()
    torch.manual_seed(0)
    layers = [(fp8_weight(QKV, HIDDEN), fp8_weight(HIDDEN, HIDDEN)) for _ in range(LAYERS)]
    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    per_us = spin_cycles_per_us()
    rows = []
    for window in (0, 4, 8, 12):
        cycles = int(window * per_us)
        base = time_step(layers, x, cycles, "none")
        for mode in ("early", "late"):
            t = time_step(layers, x, cycles, mode)
            rows.append({"window_us": window, "mode": mode, "layer_us": round(t, 2),
                         "no_prefetch_us": round(base, 2), "gain_us": round(base - t, 2)})
            print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    stem = f"{datetime.date.today()}_prefetch_{gpu_name()}"
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"gpu": gpu_name(), "spin_cycles_per_us": per_us, "rows": rows}, f, indent=1)
    lines = ["| window (us) | join | layer, prefetch (us) | layer, none (us) | gain (us) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['window_us']} | {r['mode']} | {r['layer_us']} | {r['no_prefetch_us']} | "
              f"{r['gain_us']} |" for r in rows]
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
