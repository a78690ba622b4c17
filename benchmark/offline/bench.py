"""Offline throughput: the workload of docs/performance.md through `LLM.generate`, next to
transformers.

    python benchmark/offline/bench.py --model benchmark/configs/qwen3-0.6b.json \
        --variants default,no-cuda-graph,torch-attn --hf-requests 64

A ``.json`` model is a bare config: the weights are random (``--dummy-weights``). Output tok/s is
reported with its fraction of the bandwidth ceiling (output tok/s at peak HBM bandwidth with no CPU
overhead); transformers runs on a subset of the same workload in the same process, on the same GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

from bench_common import (  # noqa: E402
    borrow_tokenizer,
    environment,
    gpu_name,
    model_dir,
    project_commit,
)
from bench_runs import llm_options, run_batch1, run_hf, run_minisgl  # noqa: E402
from ceiling import batch1_floor_ms, ceiling_tok_per_s  # noqa: E402

# LLM options, plus "sampling": SamplingParams fields of every request and "env": variables set
# while the variant runs
QWEN_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}  # Qwen3's recommended settings
VARIANTS = {
    "default": {},
    "no-cuda-graph": {"cuda_graph_max_bs": 0, "piecewise_cuda_graph_max_tokens": 0},
    "no-piecewise": {"piecewise_cuda_graph_max_tokens": 0},  # prefill/mixed steps all eager
    # piecewise graphs every 64 tokens up to 4,096 (the default is coarser past 1,024)
    "piecewise-every-64": {"piecewise_cuda_graph_tokens": tuple(range(64, 4097, 64))},
    "no-overlap": {"disable_overlap": True},
    "torch-attn": {"attn": "torch"},
    "fi": {"attn": "fi"},  # FlashInfer's paged kernels (pip install -e '.[flashinfer]')
    "fi-triton": {"attn": "fi,triton"},  # FlashInfer's prefill, the Triton decode
    "page16": {"page_size": 16},
    # sliding-window models: one pool for every layer (the default sizes the sliding layers' own)
    "one-pool": {"sliding_pool_ratio": 0},
    "prefill-first": {"schedule_mode": "prefill-first"},  # the ablation of mixed steps
    "sample": {"sampling": QWEN_SAMPLING},
    "sample-penalty": {"sampling": {**QWEN_SAMPLING, "presence_penalty": 1.5,
                                    "repetition_penalty": 1.05}},
    "sample-logprobs": {"sampling": {**QWEN_SAMPLING, "logprobs": True, "top_logprobs": 5}},
    "fp8": {"quantization": "fp8"},  # weights quantized at load (random bf16 weights of --model)
    "fp8-kv": {"kv_cache_dtype": "fp8_e4m3"},
    # hybrid models: the delta-rule state in bf16 (half its bytes), the torch linear attention
    "state-bf16": {"mamba_ssm_dtype": "bfloat16"},
    "fp8+fp8-kv": {"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"},
    # MXFP4 experts through OpenAI's triton_kernels (pip install -e '.[triton-kernels]')
    "triton-kernels": {"moe_backend": "triton_kernels"},
    # MXFP4 experts in the fragment layout, every batch on its GEMM (quant/mxfp4_fragments.py)
    "moe-fragments": {"moe_backend": "triton_fragments"},
    # and its table's tiles on the Gluon kernels (kernel/triton/moe_mxfp4_gluon.py; the default
    # on Hopper)
    "moe-gluon": {"moe_backend": "triton_fragments_gluon"},
    # MXFP4 experts in the word layout (quant/mxfp4.py; the default elsewhere)
    "moe-words": {"moe_backend": "triton"},
    # MXFP4 experts through FlashInfer's CUTLASS fused MoE (pip install -e '.[flashinfer]')
    "flashinfer-moe": {"moe_backend": "flashinfer"},
    "no-pdl": {"disable_pdl": True},  # Triton kernels without programmatic dependent launch
    "fp8-no-pdl": {"quantization": "fp8", "disable_pdl": True},
    "no-pad-tokens": {"pad_tokens": 1},  # eager forwards at their own token counts
    # one token through the RMSNorm kernels, not normalised inside the GEMVs
    "fp8-no-norm-gemv": {"quantization": "fp8", "disable_norm_gemv": True},
    # batches: the QKV and gate-up inputs quantized by a kernel of their own, not by the RMSNorm
    "fp8-no-norm-quant": {"quantization": "fp8", "disable_norm_quant": True},
    # weights in 128x128 blocks with a scale each, as the published FP8 checkpoints store them
    "fp8-block": {"quantization": "fp8-block"},
    # one-token unquantized linear layers through cuBLAS, not the Triton GEMV
    "cublas": {"disable_gemv": True},
    "sample-torch": {"sampling": QWEN_SAMPLING, "sampler": "torch"},
    "sample-row": {"sampling": QWEN_SAMPLING, "sampler": "triton-row"},  # the row kernel alone
    "sample-penalty-torch": {"sampling": {**QWEN_SAMPLING, "presence_penalty": 1.5,
                                          "repetition_penalty": 1.05}, "sampler": "torch"},
}


def workload(n: int = 256) -> tuple[list[list[int]], list[int]]:
    """256 prompts of 100-1024 random ids, then 256 output lengths of 100-1024 (seed 0)."""
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))]
               for _ in range(n)]
    max_tokens = [random.randint(100, 1024) for _ in range(n)]
    return prompts, max_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="HF directory, or a config.json (dummy weights)")
    parser.add_argument("--variants", default="default",
                        help=f"comma list of {list(VARIANTS)} ('': batch 1 alone)")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--tp", default="1", help="comma list of tensor-parallel sizes to run")
    parser.add_argument("--hf-requests", type=int, default=64, help="0 skips transformers")
    parser.add_argument("--hf-batch", type=int, default=64)
    parser.add_argument("--structured", action="store_true",
                        help="run each variant again with a JSON schema on half the requests")
    parser.add_argument("--batch1", action="store_true",
                        help="also measure batch-1 decode latency (Triton GEMV, then cuBLAS)")
    parser.add_argument("--batch1-variants", default="default",
                        help="variants whose batch-1 latency --batch1 measures "
                             "(default adds cuBLAS)")
    parser.add_argument("--batch1-baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="--batch1 also runs the model as it is (Triton GEMV, then "
                             "cuBLAS); --no-batch1-baseline: only --batch1-variants (default "
                             "among them: the Triton GEMV alone)")
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    parser.add_argument("--tag", help="suffix of the result files' name")
    args = parser.parse_args()

    path, dummy = model_dir(args.model)
    if args.structured and dummy:
        borrow_tokenizer(path)
    name = os.path.basename(args.model).removesuffix(".json")
    prompts, max_tokens = workload()
    prompts, max_tokens = prompts[: args.num_requests], max_tokens[: args.num_requests]
    gpu = gpu_name()
    with open(os.path.join(path, "config.json")) as f:
        raw_config = json.load(f)
    lens = [len(p) for p in prompts]
    commit = project_commit()
    base = {"model": name, "gpu": gpu, "date": datetime.date.today().isoformat(), "commit": commit,
            "num_requests": len(prompts), "prompt_tokens": sum(map(len, prompts))}
    records = []

    def record(engine: str, result: dict, state_bytes: int = 4, **extra) -> None:
        tps = result["output_tokens"] / result["seconds"]
        # the bandwidth ceiling (ceiling.py); N GPUs: N times the bandwidth
        n = extra.get("hf_requests", len(lens))  # transformers runs the first n requests
        ceiling = ceiling_tok_per_s(raw_config, lens[:n], max_tokens[:n], gpu, state_bytes)
        top = round(ceiling * result.get("tp", 1)) if ceiling else None
        rec = {**base, "engine": engine, **result, "output_tok_per_s": round(tps, 1),
               "ceiling_tok_per_s": top, "ceiling_fraction": round(tps / top, 3) if top else None,
               **extra}
        records.append(rec)
        print(json.dumps(rec), flush=True)

    for tp in map(int, args.tp.split(",")):
        for variant in filter(None, args.variants.split(",")):
            engine = f"minisgl[{variant}]" + (f"[tp{tp}]" if tp > 1 else "")
            state_bytes = 2 if VARIANTS[variant].get("mamba_ssm_dtype") == "bfloat16" else 4
            record(engine, run_minisgl(path, dummy, prompts, max_tokens, VARIANTS[variant], tp),
                   state_bytes)
            if variant != "default" and any(r["engine"].startswith("minisgl[default]")
                                            and r["tp"] == tp for r in records):
                ref = next(r for r in records if r["engine"].startswith("minisgl[default]")
                           and r["tp"] == tp)
                print(f"{engine}: {records[-1]['output_tok_per_s'] / ref['output_tok_per_s']:.3f}x "
                      "of minisgl[default]", flush=True)
            if args.structured:
                record(engine + "[json-half]", run_minisgl(path, dummy, prompts, max_tokens,
                                                           VARIANTS[variant], tp, structured=True))
    if args.batch1:
        runs = [("minisgl[batch1]", {}), ("minisgl[batch1][cublas]", VARIANTS["cublas"])]
        listed = args.batch1_variants.split(",")
        runs = runs if args.batch1_baseline else runs[:1] if "default" in listed else []
        runs += [(f"minisgl[batch1][{v}]", VARIANTS[v])
                 for v in listed if v not in ("default", "cublas")]
        for tp in map(int, args.tp.split(",")):
            for engine, variant in runs:
                with environment(variant.get("env", {})):
                    res = run_batch1(path, dummy, llm_options(variant), tp=tp)
                # what one token's step must stream (weights, the experts one token routes to)
                floor = batch1_floor_ms(raw_config, gpu, tp)
                if floor is not None:
                    res["floor_ms"] = round(floor, 3)
                    if res["ms_per_token"] < floor:
                        res["below_floor"] = True  # a measuring error until shown otherwise
                records.append({**base, "engine": engine + (f"[tp{tp}]" if tp > 1 else ""),
                                **res})
                print(json.dumps(records[-1]), flush=True)
    if args.hf_requests:
        n = args.hf_requests
        record("transformers", run_hf(path, dummy, prompts[:n], max_tokens[:n], args.hf_batch),
               hf_requests=n)
    suffix = f"_{args.tag}" if args.tag else ""
    command = " ".join(["python", *sys.argv])
    write(records, args.out, f"offline_{name}_{gpu}{suffix}", command)


def write(records: list[dict], out_dir: str, stem: str, command: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, stem + ".json"), "w") as f:
        json.dump(records, f, indent=1)
    first = records[0] if records else {}
    lines = [f"`{command}` on {first.get('gpu')}, commit `{first.get('commit')}`, "
             f"{first.get('date')}.", "",
             "| engine | model | gpu | output tok/s | fraction of ceiling | seconds "
             "| output tokens |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        if "output_tok_per_s" in r:
            lines.append(f"| {r['engine']} | {r['model']} | {r['gpu']} | "
                         f"{r['output_tok_per_s']:,.0f} | {r['ceiling_fraction'] or ''} | "
                         f"{r['seconds']:.1f} | {r['output_tokens']:,} |")
        else:
            floor = r.get("floor_ms")
            of_floor = f"floor {floor:.2f} ms: {floor / r['ms_per_token']:.2f}" if floor else ""
            lines.append(f"| {r['engine']} | {r['model']} | {r['gpu']} | "
                         f"{r['ms_per_token']:.2f} ms/token | {of_floor} | | |")
    default = {r.get("tp"): r["output_tok_per_s"] for r in records
               if r["engine"].startswith("minisgl[default]")}
    variants = [r for r in records if r["engine"].startswith("minisgl[") and "output_tok_per_s" in r
                and r.get("tp") in default and not r["engine"].startswith("minisgl[default]")]
    if variants:
        kv = {r.get("tp"): r.get("kv_tokens") for r in records
              if r["engine"].startswith("minisgl[default]")}
        lines += ["", "| engine | output tok/s | ratio to default (same run) | KV tokens (ratio) |",
                  "|---|---|---|---|"]
        for r in variants:
            ref_kv = kv.get(r.get("tp"))
            kv_ratio = (f"{r['kv_tokens']:,} ({r['kv_tokens'] / ref_kv:.2f}x)"
                        if ref_kv and r.get("kv_tokens") else "")
            lines.append(f"| {r['engine']} | {r['output_tok_per_s']:,.0f} | "
                         f"{r['output_tok_per_s'] / default[r.get('tp')]:.3f}x | {kv_ratio} |")
    rates = [r for r in records if "output_tok_per_s" in r]
    tp1 = {r["engine"]: r["output_tok_per_s"] for r in rates if r.get("tp") == 1}
    scaled = [r for r in rates if r.get("tp", 1) > 1 and r["engine"].rsplit("[tp", 1)[0] in tp1]
    if scaled:
        lines += ["", "| engine | TP | output tok/s | speed-up over TP=1 | per GPU |",
                  "|---|---|---|---|---|"]
        for r in scaled:
            speedup = r["output_tok_per_s"] / tp1[r["engine"].rsplit("[tp", 1)[0]]
            lines.append(f"| {r['engine']} | {r['tp']} | {r['output_tok_per_s']:,.0f} | "
                         f"{speedup:.2f}x | {speedup / r['tp']:.2f} |")
    loaded = [r for r in records if r.get("weight_gib") is not None]
    if loaded:
        lines += ["", "| engine | TP | weights per GPU (GiB) | peak while loading (GiB) |",
                  "|---|---|---|---|"]
        lines += [f"| {r['engine']} | {r.get('tp', 1)} | {r['weight_gib']} | "
                  f"{r['load_peak_gib'] if r['load_peak_gib'] is not None else ''} |"
                  for r in loaded]
    traced = [r for r in records if r.get("trace")]
    if traced:
        lines += ["", "Where the time goes (scheduler steps of the timed run, by the batch read "
                  "back; decode TB/s = weights + every request's KV read once per step):", "",
                  "| engine | phase | steps | seconds | requests/step |", "|---|---|---|---|---|"]
        for r in traced:
            for phase, v in r["trace"]["steps"].items():
                lines.append(f"| {r['engine']} | {phase} | {v['steps']} | {v['seconds']:.2f} | "
                             f"{v['requests'] / v['steps']:.0f} |")
            lines.append(f"| {r['engine']} | decode TB/s | | {r['trace']['decode_seconds']:.2f} | "
                         f"{r['trace']['decode_tb_per_s']} |")
    with open(os.path.join(out_dir, stem + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
