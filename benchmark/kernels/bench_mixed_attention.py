"""Attention of a mixed batch (decode rows, then prefill chunks): decode rows through the split-K
decode kernel, or through the extend kernel as one-token extends
(``TritonBackend.mixed_decode_kernel``).

    python benchmark/kernels/bench_mixed_attention.py [--out DIR]

Per case (model shape, decode rows and their context, prefill chunk and its prefix): the median
time of one layer's attention through the backend's ``forward`` (eager, as mixed steps run), bf16,
page size 1 with every token in a random slot. The faster variant should be the default of
``TritonBackend.mixed_decode_kernel``. With flashinfer installed (and no ``--no-fi``), the same
batch through ``--attn fi`` (FlashInfer's paged prefill wrapper over every row, decode rows as
one-token extends): its ``forward`` on a plan made once (as a step's layers share one), and the
step's planning apart (``prepare_metadata`` + the plan of the first layer, host wall time).
Writes ``<date>_mixed_attention_<gpu>.{json,md}`` with --out.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from minisgl.attention.triton_backend import TritonBackend  # noqa: E402
from minisgl.core import Batch, Feed, Req, SamplingParams  # noqa: E402
from minisgl.kvcache.mha_pool import MHAKVCache  # noqa: E402
from minisgl.kvcache.spec import AttentionSpec  # noqa: E402

MODELS = {"Qwen3-0.6B": (16, 8, 128), "Qwen3-8B": (32, 8, 128)}  # (q heads, kv heads, head_dim)
# (decode rows, their context, prefill chunk tokens, the chunk's prefix)
CASES = [(16, 1024, 512, 0), (64, 1024, 512, 512), (64, 1024, 2048, 0), (128, 1024, 1024, 0),
         (128, 4096, 512, 0), (256, 1024, 256, 768)]


def mixed_batch(decode: int, ctx: int, chunk: int, prefix: int, hkv: int, dim: int,
                dtype: torch.dtype = torch.bfloat16, device: str = "cuda"):
    """A one-layer pool, a page table of random slots, and the mixed batch over it."""
    lens = [ctx] * decode + [prefix + chunk]
    slots = sum(lens) + 1
    pool = MHAKVCache(1, hkv, dim, slots, 1, dtype, torch.device(device))
    pool.k_cache(0).normal_()
    pool.v_cache(0).normal_()
    table = torch.zeros(len(lens) + 1, max(lens), dtype=torch.int32, device=device)
    perm = torch.randperm(slots - 1, device=device).to(torch.int32) + 1
    reqs, used = [], 0
    for i, n in enumerate(lens):
        table[i, :n] = perm[used : used + n]
        used += n
        cached = n - 1 if i < decode else prefix
        reqs.append(Req(uid=i, input_ids=[0] * (n + 1), prompt_len=n + 1,
                        sampling_params=SamplingParams(), max_device_len=n + 2, table_idx=i,
                        cached_len=cached, device_len=n))
    return pool, table, Batch([Feed.of(r) for r in reqs], "mixed", num_decode=decode)


def fi_times(pool, table, batch, q, dim: int) -> tuple[float, float, torch.Tensor]:
    """``--attn fi`` on the batch: forward us (planned), plan us (host, synchronised), output."""
    import time

    from triton.testing import do_bench

    from minisgl.attention.fi_backend import FlashInferBackend
    from minisgl.kvcache.spec import AttentionSpec

    backend = FlashInferBackend(pool, table)
    spec = AttentionSpec(0, q.shape[1], pool.k_cache(0).shape[1], dim, dim**-0.5)
    fn = lambda: backend.forward(q, None, None, spec, batch)  # noqa: E731
    backend.prepare_metadata(batch)
    out = fn().float()  # compiles on first use
    plans = []
    for _ in range(20):
        torch.cuda.synchronize()
        tic = time.perf_counter()
        backend.prepare_metadata(batch)
        backend.forward(q, None, None, spec, batch)
        torch.cuda.synchronize()
        plans.append(time.perf_counter() - tic)
    run_us = do_bench(fn, return_mode="median") * 1000
    plan_us = max(0.0, sorted(plans)[len(plans) // 2] * 1e6 - run_us)
    return round(run_us, 1), round(plan_us, 1), out


def time_case(model: str, case: tuple[int, int, int, int], fi: bool = False) -> dict:
    from triton.testing import do_bench

    hq, hkv, dim = MODELS[model]
    decode, ctx, chunk, prefix = case
    pool, table, batch = mixed_batch(decode, ctx, chunk, prefix, hkv, dim)
    q = torch.randn(decode + chunk, hq, dim, dtype=torch.bfloat16, device="cuda")
    row = {"model": model, "decode_rows": decode, "context": ctx, "chunk": chunk, "prefix": prefix}
    outs = {}
    for name, flag in (("decode_kernel", True), ("extend_kernel", False)):
        backend = TritonBackend(pool, table)
        backend.mixed_decode_kernel = flag
        backend.prepare_metadata(batch)
        spec = AttentionSpec(0, hq, hkv, dim, dim**-0.5)
        fn = lambda: backend.forward(q, None, None, spec, batch)  # noqa: E731
        outs[name] = fn().float()
        row[f"{name}_us"] = round(do_bench(fn, return_mode="median") * 1000, 1)
    row["max_abs_diff"] = float((outs["decode_kernel"] - outs["extend_kernel"]).abs().max())
    if fi:
        row["fi_us"], row["fi_plan_us"], out = fi_times(pool, table, batch, q, dim)
        row["fi_max_abs_diff"] = float((out - outs["decode_kernel"]).abs().max())
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--no-fi", action="store_true", help="leave FlashInfer out")
    p.add_argument("--out", help="directory for the JSON and markdown results")
    args = p.parse_args()
    gpu = torch.cuda.get_device_name()
    fi = not args.no_fi and importlib.util.find_spec("flashinfer") is not None
    rows = [time_case(m, c, fi) for m in MODELS for c in CASES]
    head = ["model", "decode rows", "context", "chunk", "prefix", "decode kernel (us)",
            "extend kernel (us)", "max |diff|"]
    keys = ["model", "decode_rows", "context", "chunk", "prefix", "decode_kernel_us",
            "extend_kernel_us", "max_abs_diff"]
    if fi:
        head += ["fi (us)", "fi plan (us)", "fi max |diff|"]
        keys += ["fi_us", "fi_plan_us", "fi_max_abs_diff"]
    lines = [f"### mixed-batch attention, one layer, bf16, {gpu}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[k]) for k in keys) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        tag = "H100" if "H100" in gpu else "H200" if "H200" in gpu else gpu.replace(" ", "_")
        base = os.path.join(args.out, f"{datetime.date.today()}_mixed_attention_{tag}")
        with open(base + ".json", "w") as f:
            json.dump({"gpu": gpu, "rows": rows}, f, indent=1)
        with open(base + ".md", "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
