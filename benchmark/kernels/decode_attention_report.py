"""The results of ``bench_decode_attention.py`` written out: ``<stem>.json`` (the run's metadata,
every decode and prefill row) and ``<stem>.md`` (the decode table, our kernel against SDPA and,
when it ran, FlashInfer; then the prefill table)."""

from __future__ import annotations

import json

import torch
import triton


def write(stem: str, meta: dict, results: list[dict], prefill: list[dict], fi) -> None:
    """``fi``: the flashinfer module its columns came from, or None (no columns)."""
    gpu, date = meta["gpu"], meta["date"]
    with open(stem + ".json", "w") as f:
        json.dump(dict(meta=meta, decode=results, prefill=prefill), f, indent=1)
    lines = [f"# Decode attention: paged Triton vs dense SDPA, {gpu}, {date}", "",
             f"bf16, page size 1 (shuffled slots), torch {torch.__version__}, triton "
             f"{triton.__version__}. Times are per call, replayed from a CUDA graph (how the "
             "engine runs decode) over enough input copies to exceed L2, median of triton's "
             "do_bench (L2 flushed between replays); TB/s = K+V bytes / time; ref = faster "
             "of SDPA flash / cuDNN on contiguous K/V with the GQA group packed as query rows. "
             "Eager columns: one call per do_bench run, launch overhead included."
             + (f" fi: FlashInfer {fi.__version__}'s paged decode on the same pages (fi/ours > 1: "
                "FlashInfer faster)." if fi is not None else ""), "",
             "| model | B | ctx | splits | ours us | ref us | ours TB/s | ref TB/s | ours/ref |"
             " eager ours us | eager ref us |"
             + (" fi us | fi TB/s | ours/fi | fi cc us |" if fi else ""),
             "|---" * (15 if fi else 11) + "|"]
    for r in results:
        ref_ms = min((t for t in (r["flash_ms"], r["cudnn_ms"]) if t is not None), default=None)
        ref = (f"- | {r['ours_tbps']:.2f} | - | - |" if ref_ms is None else  # no SDPA backend
               f"{ref_ms * 1e3:.1f} | {r['ours_tbps']:.2f} | {r['ref_tbps']:.2f} | "
               f"{r['ratio']:.2f} |")
        eager_ref = min((t for t in (r["eager_flash_ms"], r["eager_cudnn_ms"]) if t), default=0)
        fi_cols = (f" {r['fi_ms'] * 1e3:.1f} | {r['fi_tbps']:.2f} | {r['fi_vs_ours']:.2f} |"
                   f" {r['fi_cc_ms'] * 1e3:.1f} |" if "fi_cc_ms" in r else
                   f" {r['fi_ms'] * 1e3:.1f} | {r['fi_tbps']:.2f} | {r['fi_vs_ours']:.2f} | - |"
                   if "fi_ms" in r else "")
        lines.append(f"| {r['model']} | {r['batch']} | {r['ctx']} | {r['splits']} | "
                     f"{r['ours_ms'] * 1e3:.1f} | {ref} {r['eager_ours_ms'] * 1e3:.1f} | "
                     f"{eager_ref * 1e3:.1f} |" + fi_cols)
    if prefill:
        lines += ["", "Prefill (Qwen3-8B heads, bf16): extend kernel vs FlashAttention varlen"
                  + (" and FlashInfer's paged prefill" if fi else ""), "",
                  "| B | new | prefix | triton ms | fa ms | triton TFLOP/s | fa TFLOP/s |"
                  + (" fi ms | fi TFLOP/s |" if fi else ""), "|---" * (9 if fi else 7) + "|"]
        for r in prefill:
            fa = f"{r['fa_ms']:.3f} | " if "fa_ms" in r else "- | "
            fat = f"{r['fa_tflops']:.0f}" if "fa_tflops" in r else "-"
            fic = f" {r['fi_ms']:.3f} | {r['fi_tflops']:.0f} |" if "fi_ms" in r else ""
            lines.append(f"| {r['batch']} | {r['extend']} | {r['prefix']} | {r['triton_ms']:.3f} | "
                         f"{fa}{r['triton_tflops']:.0f} | {fat} |{fic}")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
