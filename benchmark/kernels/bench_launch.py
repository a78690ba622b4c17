"""The host's cost of launching one eager layer's kernels, by how the token count varies.

    python benchmark/kernels/bench_launch.py

An eager forward (prefill or mixed step) is launched by the host while the GPU still runs the step
before; when launching costs more than the GPU's work, the step is as long as the host's time. This
measures the host time of one call (the GPU is drained before each, so a full launch queue never
blocks it) for a bf16 ``F.linear`` of Qwen3-8B's shapes when every call has the same token count,
when the count changes every call (mixed steps: decode rows plus whatever prefill fits), and when
it changes but is rounded up to a multiple of 64; and for one Triton kernel (RMSNorm) and
``torch.empty``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from minisgl.kernel.triton.norm import rms_norm  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


def host_us(fn, counts: list[int]) -> float:
    """Median host time of ``fn(m)`` over ``counts`` (microseconds)."""
    times = []
    for m in counts:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(m)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--out", default="bench-out", help="results (./bench-out)")
    args = p.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    rng = random.Random(0)
    max_m = 1088
    fixed = [512] * args.calls
    varying = [rng.randint(65, 1024) for _ in range(args.calls)]
    rounded = [-(-m // 64) * 64 for m in varying]
    x = torch.randn(max_m, 12288, device=dev, dtype=dt)
    rows = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev, dtype=dt)

        def fn(m: int, w: torch.Tensor = w, k: int = k) -> torch.Tensor:
            return F.linear(x[:m, :k], w)

        fn(512)
        rows.append({"op": f"F.linear {name} [{n}x{k}]",
                     **{label: round(host_us(fn, counts), 1) for label, counts in
                        (("same count", fixed), ("new count each call", varying),
                         ("rounded to 64", rounded))}})
        del w, fn  # free this shape's weight before the next one is allocated
    weight = torch.ones(4096, device=dev, dtype=dt)
    h = torch.randn(max_m, 4096, device=dev, dtype=dt)
    norm = lambda m: rms_norm(h[:m], weight, 1e-6)  # noqa: E731
    norm(512)
    rows.append({"op": "Triton rms_norm [m x 4096]", "same count": round(host_us(norm, fixed), 1),
                 "new count each call": round(host_us(norm, varying), 1)})
    empty = lambda m: torch.empty(m, 4096, device=dev, dtype=dt)  # noqa: E731
    rows.append({"op": "torch.empty", "same count": round(host_us(empty, fixed), 1),
                 "new count each call": round(host_us(empty, varying), 1)})
    name = torch.cuda.get_device_name()
    lines = [f"### host time of one launch, median us ({name}, torch {torch.__version__})", "",
             "| op | same count | new count each call | rounded to 64 |", "|---|---|---|---|"]
    lines += [f"| {r['op']} | {r['same count']} | {r['new count each call']} | "
              f"{r.get('rounded to 64', '')} |" for r in rows]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "launch_cost.json"), "w") as f:
        json.dump({"gpu": name, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "launch_cost.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
