"""Where a decode step's time goes: torch.profiler over decode (batch 1 unless ``--batch``), kernels
ranked by GPU time.

    python benchmark/offline/profile_decode.py --model benchmark/configs/qwen3-8b.json --out DIR

``--per-step``: also profile the same requests with one output token and print each kernel's GPU
time per decode step (the difference of the two runs over the steps between them) next to the
wall time per step, and the GPU's idle time per step (no kernel or copy running). The warm-up run
leaves the prompts in the prefix cache, so the measured runs prefill one token per request and
the rest is decode at the full batch. Kernels launched with PDL start before their predecessor
ends and wait, so their times overlap and may sum to more than the wall time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))

from bench import VARIANTS, model_dir  # noqa: E402
from bench_runs import llm_options  # noqa: E402

from minisgl import LLM, SamplingParams  # noqa: E402


def _one_token(params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(params, max_tokens=1)


def _device_us(prof) -> dict[str, tuple[float, int]]:
    return {e.key: (e.self_device_time_total, e.count) for e in prof.key_averages()
            if e.self_device_time_total > 0}


def gpu_idle(prof) -> tuple[float, float, list[tuple[float, float, str, str]]]:
    """(span, busy) microseconds of the GPU's kernels and copies in ``prof``, and the gaps between
    them (no kernel or copy running): (length, offset from the first, the name before, after)."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if e.device_type == DeviceType.CUDA)
    if not spans:
        return 0.0, 0.0, []
    busy, gaps = 0.0, []
    start, end, name = spans[0]
    for s, e, n in spans[1:]:  # ``name``: the event that ends last so far
        if s > end:
            busy += end - start
            gaps.append((s - end, end - spans[0][0], name[:40], n[:40]))
            start, end, name = s, e, n
        elif e > end:
            end, name = e, n
    busy += end - start
    return spans[-1][1] - spans[0][0], busy, gaps


def idle_table(full, one_token, steps: int) -> str:
    """The GPU's idle time per decode step (``full`` minus ``one_token``), and the gaps behind
    it."""
    (span, busy, gaps), (span0, busy0, _) = gpu_idle(full), gpu_idle(one_token)
    idle = (span - busy - (span0 - busy0)) / steps
    big = sorted((g for g in gaps if g[0] >= 20), reverse=True)
    small = sum(g[0] for g in gaps if g[0] < 20)
    lines = [f"GPU idle per decode step: {idle:.0f} us (profiled run: span {span / 1e3:.1f} ms, "
             f"busy {busy / 1e3:.1f} ms; one output token: span {span0 / 1e3:.1f}, busy "
             f"{busy0 / 1e3:.1f})",
             f"gaps < 20 us: {len(gaps) - len(big)}, {small / 1e3:.2f} ms in all; gaps >= 20 us: "
             f"{len(big)}, {sum(g[0] for g in big) / 1e3:.2f} ms in all, the largest:"]
    lines += [f"  {g:9.0f} us at {at / 1e3:8.2f} ms, after {before} / before {after}"
              for g, at, before, after in big[:8]]
    return "\n".join(lines)


def per_step_table(full, one_token, steps: int, wall_s: float) -> str:
    """Kernels' GPU microseconds per decode step: ``full`` minus ``one_token``, over ``steps``."""
    a, b = _device_us(full), _device_us(one_token)
    rows = []
    for name, (us, n) in a.items():
        us0, n0 = b.get(name, (0.0, 0))
        if (us - us0) / steps > 0.05:
            rows.append(((us - us0) / steps, (n - n0) / steps, name))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    lines = [f"per decode step: wall {wall_s * 1e6:.0f} us (unprofiled), kernels {total:.0f} us",
             f"{'us/step':>9} {'share':>6} {'calls/step':>10}  kernel"]
    lines += [f"{us:9.1f} {us / total:6.1%} {calls:10.1f}  {name[:90]}" for us, calls, name in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128, help="tokens of every prompt")
    parser.add_argument("--out", default=".")
    parser.add_argument("--quantization", default=None, help="e.g. fp8")
    parser.add_argument("--variant", default="default",
                        help="a bench.py variant: its engine options, environment and sampling")
    parser.add_argument("--per-step", action="store_true",
                        help="kernels' GPU time and the GPU's idle time per decode step")
    args = parser.parse_args()
    path, dummy = model_dir(args.model)
    # KV for every request's whole context at once: the batch decodes together (a smaller pool
    # would run it in waves)
    pages = args.batch * (args.prompt_len + args.tokens) + 1
    variant = VARIANTS[args.variant]
    options = {"quantization": args.quantization, **llm_options(variant)}
    os.environ.update(variant.get("env", {}))  # this process runs the one variant
    # the untimed first run compiles what the measured ones use
    llm = LLM(path, dummy_weights=dummy, num_pages=pages, warmup="off", **options)
    prompts = [[(7 * i + j) % 10000 for j in range(args.prompt_len)] for i in range(args.batch)]
    sampling = variant.get("sampling", {"temperature": 0})
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, **sampling)
    llm.generate(prompts, params, use_tqdm=False)
    tic = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - tic
    print(f"{args.variant}: {wall / args.tokens * 1e3:.2f} ms per step "
          f"(batch {args.batch}, unprofiled)", flush=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        llm.generate(prompts, params, use_tqdm=False)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    table += "\n" + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    if args.per_step:
        tic = time.perf_counter()
        llm.generate(prompts, _one_token(params), use_tqdm=False)
        wall_one = time.perf_counter() - tic
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as one:
            llm.generate(prompts, _one_token(params), use_tqdm=False)
        steps = args.tokens - 1
        table += "\n" + per_step_table(prof, one, steps, (wall - wall_one) / steps)
        table += "\n" + idle_table(prof, one, steps)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    tag = "".join(f"_{t}" for t in (args.quantization, args.variant) if t and t != "default")
    tag += f"_prompt{args.prompt_len}" if args.prompt_len != 128 else ""
    with open(os.path.join(args.out, f"profile_decode_bs{args.batch}{tag}.txt"), "w") as f:
        f.write(table)


if __name__ == "__main__":
    main()
