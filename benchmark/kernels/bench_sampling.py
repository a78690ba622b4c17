"""One sampling call: the Triton sampler (default: the split-row path of
``sampling/kernels/split.py``), the one-program-per-row kernel alone (the ``triton-row`` sampler,
``sampling/kernels/row.py``) and the torch reference (``sampling/torch_ref.py``), next to the
decode step of the model it serves.

    python benchmark/kernels/bench_sampling.py [--model benchmark/configs/qwen3-0.6b.json]
        [--out DIR]

Cases: batch sizes 1, 64, 256 at vocabularies 151,936 (Qwen) and 32,000 (Llama 2 / Mistral), bf16
logits, for the settings users send: Qwen3's recommended sampling (T 0.6, top_p 0.95, top_k 20), the
same with presence and repetition penalties (each row with a prompt and 256 output tokens counted),
with log-probs (top 5), and top_p alone. Each call is timed with CUDA events over many calls
(penalty rows keep counting, as in decode). GB/s counts one read of the logits by the default
path; "flagged" is the share of rows the split path handed to the row kernel. ``--model`` also
times one decode step of that model (random weights, CUDA graphs) at each batch size, which is what
the sampling time adds to. Writes JSON and markdown named ``<date>_sampling_<gpu>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import cuda_ms, gpu_name, model_dir  # noqa: E402

from minisgl.core import Req, SamplingParams  # noqa: E402
from minisgl.sampling import (  # noqa: E402
    BatchSamplingArgs,
    SamplingState,
    kernel_sample,
    sample,
)

QWEN = dict(temperature=0.6, top_p=0.95, top_k=20)
SETTINGS = {
    "sample": QWEN,
    "sample-penalty": {**QWEN, "presence_penalty": 1.5, "repetition_penalty": 1.05},
    "sample-logprobs": {**QWEN, "logprobs": True, "top_logprobs": 5},
    "top_p-only": dict(temperature=0.7, top_p=0.9),
}


def make_args(bsz: int, vocab: int, params: dict, device: torch.device) -> BatchSamplingArgs:
    g = torch.Generator().manual_seed(0)
    reqs = []
    for i in range(bsz):
        ids = torch.randint(0, vocab, (512 + 256,), generator=g).tolist()
        reqs.append(Req(uid=i, input_ids=ids, prompt_len=512, table_idx=i,
                        sampling_params=SamplingParams(seed=i, **params),
                        max_device_len=2048, device_len=len(ids), seed=i))
    state = SamplingState(bsz + 1, vocab, device)
    return BatchSamplingArgs.from_reqs(reqs, vocab, device, state)


def time_call(fn, iters: int = 50) -> float:
    return cuda_ms(fn, iters) * 1e3  # us


def flagged_share(logits: torch.Tensor, args: BatchSamplingArgs, **sizes) -> float:
    """Share of rows the split path leaves to the row kernel (one extra call, counts included)."""
    flags = torch.zeros(logits.shape[0], dtype=torch.int32, device=logits.device)
    kernel_sample(logits, args, flags_out=flags, **sizes)
    return round(flags.float().mean().item(), 3)


def graph_us(fn, iters: int = 50) -> float:
    """us per call of ``fn`` replayed from a CUDA graph: the GPU time without launch overhead."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_call(graph.replay, iters)


def kernel_split(fn) -> dict[str, float]:
    """GPU us per call of each kernel ``fn`` launches (torch.profiler over 20 calls)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    return {e.key: round(e.device_time_total / 20, 1) for e in prof.key_averages()
            if e.device_time_total > 0}


def sweep(out: str) -> None:
    """The split path's sizes at B=256, vocab 151,936: graph-replayed us per call for each
    (chunk, warps, cpp), the per-kernel split of the default sizes, one JSON line each."""
    device = torch.device("cuda")
    bsz, vocab = 256, 151936
    logits = (torch.randn(bsz, vocab, device=device) * 2).to(torch.bfloat16)
    rows = [{"case": "argmax (one read of the logits)",
             "graph_us": round(graph_us(lambda: logits.argmax(dim=-1)), 1)}]
    for name in ("sample", "sample-logprobs", "sample-penalty"):
        sargs = make_args(bsz, vocab, SETTINGS[name], device)
        rows.append({"case": name, "sizes": "default", "eager_us": round(time_call(
            lambda: sample(logits, sargs)), 1), "graph_us": round(graph_us(
                lambda: sample(logits, sargs)), 1), "kernels": kernel_split(
                    lambda: sample(logits, sargs))})
        print(json.dumps(rows[-1]), flush=True)
        if name == "sample-penalty":
            continue
        for chunk, warps, cpp in [(2048, 4, 1), (2048, 4, 2), (2048, 4, 4), (2048, 4, 8),
                                  (2048, 2, 4), (1024, 4, 4), (1024, 4, 8)]:
            sizes = dict(chunk=chunk, warps=warps, cpp=cpp)
            try:
                us = graph_us(lambda: kernel_sample(logits, sargs, **sizes))
            except Exception as e:  # noqa: BLE001 (a size the compiler refuses)
                rows.append({"case": name, "sizes": sizes, "error": repr(e)[:200]})
            else:
                rows.append({"case": name, "sizes": sizes, "graph_us": round(us, 1),
                             "flagged": flagged_share(logits, sargs, **sizes)})
            print(json.dumps(rows[-1]), flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{datetime.date.today().isoformat()}_sampling_sweep_"
                                f"{gpu_name()}.json"), "w") as f:
        json.dump({"commit": os.environ.get("MINISGL_COMMIT", "unknown"), "rows": rows}, f,
                  indent=1)


def decode_step_ms(model: str, sizes: list[int]) -> dict[int, float]:
    """ms per decode step of ``model`` (random weights) at each batch size: short prompts, 64
    greedy tokens each, the whole generate divided by its steps (prefill is a small part)."""
    from minisgl import LLM

    path, dummy = model_dir(model)
    out = {}
    with LLM(path, dummy_weights=dummy) as llm:
        for bsz in sizes:
            prompts = [[i % 1000 + 1] * 16 for i in range(bsz)]
            params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
            llm.generate(prompts, params, use_tqdm=False)
            torch.cuda.synchronize()
            t = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            torch.cuda.synchronize()
            out[bsz] = (time.perf_counter() - t) / 64 * 1e3
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="also time a decode step of this model (config.json)")
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    parser.add_argument("--sweep", action="store_true",
                        help="only time the split path's sizes at B=256, vocab 151,936")
    args = parser.parse_args()
    if args.sweep:
        return sweep(args.out)
    device = torch.device("cuda")
    sizes = [1, 64, 256]
    rows = []
    for vocab in (151936, 32000):
        for bsz in sizes:
            logits = (torch.randn(bsz, vocab, device=device) * 2).to(torch.bfloat16)
            for name, params in SETTINGS.items():
                sargs = make_args(bsz, vocab, params, device)
                kernel_us = time_call(lambda: sample(logits, sargs))
                row_us = time_call(lambda: sample(logits, sargs, "triton-row"))
                torch_us = time_call(lambda: sample(logits, sargs, "torch"), iters=10)
                rows.append({"vocab": vocab, "batch": bsz, "setting": name,
                             "kernel_us": round(kernel_us, 1), "row_kernel_us": round(row_us, 1),
                             "torch_us": round(torch_us, 1),
                             "flagged": flagged_share(logits, sargs),
                             "speedup": round(torch_us / kernel_us, 1),
                             "logits_gb_per_s": round(logits.numel() * 2 / kernel_us / 1e3, 1)})
                print(json.dumps(rows[-1]), flush=True)
            greedy_us = time_call(lambda: logits.argmax(dim=-1))
            rows.append({"vocab": vocab, "batch": bsz, "setting": "greedy argmax (reference point)",
                         "kernel_us": round(greedy_us, 1)})
    steps = decode_step_ms(args.model, sizes) if args.model else {}
    gpu, date = gpu_name(), datetime.date.today().isoformat()
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{date}_sampling_{gpu}")
    with open(stem + ".json", "w") as f:
        json.dump({"gpu": gpu, "date": date, "commit": os.environ.get("MINISGL_COMMIT", "unknown"),
                   "rows": rows, "decode_step_ms": steps, "model": args.model}, f, indent=1)
    lines = [f"One sampling call on {gpu} ({date}), bf16 logits; us per call.", "",
             "| vocab | batch | setting | Triton (split) | flagged | Triton (triton-row) | torch "
             "reference | speed-up | logits GB/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['vocab']:,} | {r['batch']} | {r['setting']} | {r['kernel_us']} | "
                     f"{r.get('flagged', '')} | {r.get('row_kernel_us', '')} | "
                     f"{r.get('torch_us', '')} | "
                     f"{str(r.get('speedup', '')) + 'x' if 'speedup' in r else ''} "
                     f"| {r.get('logits_gb_per_s', '')} |")
    if steps:
        lines += ["",
                  f"Decode step of {os.path.basename(args.model)} (random weights, CUDA graphs):",
                  "", "| batch | ms per step |", "|---|---|"]
        lines += [f"| {b} | {ms:.2f} |" for b, ms in steps.items()]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
