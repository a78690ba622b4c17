"""Decode attention launched longest first (``order``): launch configurations (BLOCK_N, warps,
stages) at one split, the workload's spread of context lengths and uniform ones. Qwen3-8B
heads, bf16, CUDA graphs.

    python probe_attn_cfg.py OUT.json
"""
import json
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "python")
from minisgl.kernel.triton.decode_attention import decode_attention, longest_first  # noqa: E402

HQ, HKV, D = 32, 8, 128
CFGS = [(64, 4, 3), (64, 4, 4), (64, 8, 3), (128, 8, 2), (128, 4, 2), (32, 4, 6), (32, 2, 4)]


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median") * 1e3


def main():
    gen = torch.Generator().manual_seed(1)
    out_rows = []
    for bs in (24, 48, 64, 96, 128, 192, 256):
        for kind in ("random", "uniform"):
            lens = torch.randint(100, 2048, (bs,), generator=gen).tolist()
            if kind == "uniform":
                lens = [sum(lens) // bs] * bs
            total = sum(lens)
            kc = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            slots = torch.randperm(total, generator=gen).to(torch.int32)  # scattered pages
            table = torch.zeros(bs, max(lens), dtype=torch.int32)
            start = 0
            for i, n in enumerate(lens):
                table[i, :n] = slots[start:start + n]
                start += n
            table = table.cuda()
            rows = torch.arange(bs, dtype=torch.int32, device="cuda")
            sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
            order = torch.tensor(longest_first(lens), dtype=torch.int32, device="cuda")
            q = torch.randn(bs, HQ, D, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(q)
            res = {"batch": bs, "lens": kind}
            res["no_order"] = graph_us(lambda: decode_attention(q, kc, vc, table, rows, sl,
                                                                D**-0.5, 1, out=out))
            for cfg in CFGS:
                res[str(cfg)] = graph_us(lambda c=cfg: decode_attention(
                    q, kc, vc, table, rows, sl, D**-0.5, 1, out=out, order=order, block_n=c[0],
                    num_warps=c[1], num_stages=c[2]))
            gb = total * HKV * D * 4 / 1e6
            out_rows.append(res)
            print(bs, kind, {k: f"{v:.1f}us {gb / v:.2f}" for k, v in res.items()
                             if isinstance(v, float)}, flush=True)
            del kc, vc
    json.dump({"device": torch.cuda.get_device_name(), "rows": out_rows}, open(sys.argv[1], "w"),
              indent=1)


main()
