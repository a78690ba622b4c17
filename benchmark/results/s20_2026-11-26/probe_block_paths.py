"""FP8 checkpoints' format (128x128 block-scaled weights) on Qwen3-8B's layers: which GEMM each
token count should take.

    python probe_block_paths.py OUT_DIR

At 2-8,192 tokens: x quantized per token and 128 columns (alone), + the Triton block GEMM
(``fp8_gemm``), + ``torch._scaled_mm`` with block-wise scales (cuBLAS, CUDA >= 12.9; the first of
``scaled_mm_candidates``' layouts, the one it accepts, as a first run of this probe found); up to
256 tokens the W8A16 GEMM (bf16 x) and the W8A8 GEMM with block scales; for comparison the
per-channel path (``quant.linear``'s) and bf16 cuBLAS. Timed as ``bench_fp8_small`` times (CUDA
graphs over L2-cold weight copies). Writes probe_block_paths.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "kernels"))

from bench_gemv import L2_FLUSH_BYTES, time_graph  # noqa: E402
from minisgl.kernel.triton.fp8_gemm import fp8_block_gemm, quantize_act  # noqa: E402
from minisgl.kernel.triton.fp8_quant import quantize_tokens  # noqa: E402
from minisgl.kernel.triton.fp8_w8a16 import fp8_w8a8_gemm, fp8_w8a16_gemm  # noqa: E402
from minisgl.quant.fp8 import block_gemm_reference, quantize_block, quantize_channel  # noqa: E402

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
B = (128, 128)


def rel(out, ref):
    return round(((out.float() - ref).abs().max() / ref.abs().max()).item(), 5)


def scaled_mm_candidates(xs, ws):
    """(name, scale_a, scale_b) layouts tried for block-wise ``_scaled_mm`` (the first one runs)."""
    xs_col = xs.t().contiguous().t()
    return [("a_colmajor_b_wsT", xs_col, ws.t()), ("a_rowmajor_b_wsT", xs, ws.t()),
            ("a_colmajor_b_ws", xs_col, ws),
            ("a_colmajor_b_wsT_contig", xs_col, ws.t().contiguous())]


def channel_path(a, w):
    q, s = quantize_tokens(a)
    if a.shape[0] <= 256:
        return fp8_w8a8_gemm(q, s, w[0], w[1])
    return torch._scaled_mm(q, w[0].t(), scale_a=s, scale_b=w[1].view(1, -1),
                            out_dtype=torch.bfloat16, use_fast_accum=True)


def scaled_mm_block(a, w):
    q, s = quantize_act(a, 128, column_major=True)
    return torch._scaled_mm(q, w[0].t(), scale_a=s, scale_b=w[1].t(), out_dtype=torch.bfloat16)


def alignment() -> list[dict]:
    """Which token counts cuBLAS's block-scaled GEMM takes: x's scales column-major with a leading
    dimension of exactly M, or of M rounded up to 4 / 16 (the storage of a wider tensor)."""
    n, k = 4096, 4096
    wq, ws = quantize_block(torch.randn(n, k, device="cuda") * 0.02, B)
    out = []
    for m in (1, 2, 3, 4, 8, 15, 16, 17, 100, 257, 300, 301, 1001, 4097):
        xq, xs = quantize_act(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), 128)
        ref = block_gemm_reference(xq, xs, wq, ws, B)
        r = {"m": m}
        for pad in (1, 4, 16):
            mp = -(-m // pad) * pad
            store = torch.zeros((k // 128, mp), device="cuda")
            store[:, :m] = xs.t()
            try:
                y = torch._scaled_mm(xq, wq.t(), scale_a=store[:, :m].t(), scale_b=ws.t(),
                                     out_dtype=torch.bfloat16)
                r[f"ld{pad}_err"] = rel(y, ref)
            except RuntimeError as e:
                r[f"ld{pad}_error"] = str(e).splitlines()[0][:80]
        out.append(r)
        print(r, flush=True)
    return out


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    rows = []
    aligned = alignment()
    for name, (n, k) in LAYERS.items():
        copies = max(2, min(16, L2_FLUSH_BYTES // (n * k)))
        wb = [quantize_block(torch.randn(n, k, device="cuda") * 0.02, B) for _ in range(copies)]
        wc = [quantize_channel(torch.randn(n, k, device="cuda") * 0.02) for _ in range(copies)]
        w16 = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        for m in (2, 16, 32, 64, 128, 192, 256, 512, 2048, 8192):
            calls = 64 if m <= 256 else 16
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq, xs = quantize_act(x, 128)
            ref = block_gemm_reference(xq, xs, *wb[0], B)
            r = {"layer": name, "m": m,
                 "quant_only_us": time_graph(lambda a, w: quantize_act(a, 128), wb, x, calls),
                 "block_gemm_us": time_graph(lambda a, w: fp8_block_gemm(
                     *quantize_act(a, 128), w[0], w[1], B, torch.bfloat16), wb, x, calls),
                 "channel_us": time_graph(channel_path, wc, x, calls),
                 "bf16_us": time_graph(F.linear, w16, x, calls)}
            try:
                r["scaled_mm_block_err"] = rel(scaled_mm_block(x, wb[0]), ref)
                r["scaled_mm_block_us"] = time_graph(scaled_mm_block, wb, x, calls)
            except RuntimeError as e:
                r["scaled_mm_block_error"] = str(e).splitlines()[0][:100]
            if m <= 256:
                r.update(w8a16_us=time_graph(lambda a, w: fp8_w8a16_gemm(a, w[0], w[1], B), wb, x),
                         w8a8_block_us=time_graph(lambda a, w: fp8_w8a8_gemm(
                             *quantize_act(a, 128), w[0], w[1], block=B), wb, x),
                         w8a8_block_err=rel(fp8_w8a8_gemm(xq, xs, *wb[0], block=B), ref))
            rows.append({k2: round(v * 1e6, 2) if k2.endswith("_us") else v for k2, v in r.items()})
            print(rows[-1], flush=True)
    with open(os.path.join(out_dir, "probe_block_paths.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cuda": torch.version.cuda, "alignment": aligned, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
