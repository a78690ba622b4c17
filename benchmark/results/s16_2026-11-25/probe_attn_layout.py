"""Probe (session 16): decode attention (one split, longest first) over a KV pool laid out
token-major (today's ``[slots, Hkv, D]``: a token's heads side by side, one head's row is 256 B
of every 2 KB) or head-major (``[Hkv, slots, D]`` seen through strides: one head's consecutive
slots are consecutive bytes). Slots: ``contiguous`` (each request one run), ``scattered``
(a random permutation), ``workload`` (the first two thirds of each context one run, as a prompt's
slots are; the rest one slot per request per step, as decode allocates them). Qwen3-8B heads,
bf16, contexts of 100-2,047 tokens, CUDA graphs, H100.

    python probe_attn_layout.py OUT.json
"""
import json
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "python")
from minisgl.kernel.triton.decode_attention import decode_attention, longest_first  # noqa: E402

HQ, HKV, D = 32, 8, 128


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median") * 1e3


def slot_table(lens, pattern, gen):
    total = sum(lens)
    table = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    if pattern == "scattered":
        perm = torch.randperm(total, generator=gen)
    if pattern in ("contiguous", "scattered"):
        start = 0
        for i, n in enumerate(lens):
            table[i, :n] = torch.arange(start, start + n) if pattern == "contiguous" \
                else perm[start:start + n]
            start += n
        return table
    prompt = [2 * n // 3 for n in lens]
    start = 0
    for i, p in enumerate(prompt):
        table[i, :p] = torch.arange(start, start + p)
        start += p
    # decode: step j gives every request still running one slot, in batch order
    req = torch.cat([torch.full((n - p,), i) for i, (n, p) in enumerate(zip(lens, prompt))])
    col = torch.cat([torch.arange(p, n) for n, p in zip(lens, prompt)])
    step = col - torch.tensor(prompt)[req]
    order = torch.argsort(step * len(lens) + req)
    table[req[order], col[order]] = start + torch.arange(len(order))
    return table


def main():
    gen = torch.Generator().manual_seed(1)
    rows_out = []
    for bs in (64, 128, 256):
        lens = torch.randint(100, 2048, (bs,), generator=gen).tolist()
        total = sum(lens)
        rows = torch.arange(bs, dtype=torch.int32, device="cuda")
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        order = torch.tensor(longest_first(lens), dtype=torch.int32, device="cuda")
        q = torch.randn(bs, HQ, D, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        tok = torch.randn(2, total, HKV, D, device="cuda", dtype=torch.bfloat16)
        head = tok.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # same values, head-major
        res = {"batch": bs, "gb": total * HKV * D * 4 / 1e9}
        for pattern in ("contiguous", "workload", "scattered"):
            table = slot_table(lens, pattern, gen).to(torch.int32).cuda()
            ref = None
            for name, kv in (("token", tok), ("head", head)):
                o = decode_attention(q, kv[0], kv[1], table, rows, sl, D**-0.5, 1, out=out,
                                     order=order).clone()
                if ref is None:
                    ref = o
                assert torch.equal(o, ref), "layouts disagree"
                res[f"{pattern}_{name}"] = graph_us(lambda kv=kv, table=table: decode_attention(
                    q, kv[0], kv[1], table, rows, sl, D**-0.5, 1, out=out, order=order))
        rows_out.append(res)
        print(bs, {k: (f"{v:.1f}us {res['gb'] * 1e3 / v:.2f}TB/s" if k != "gb" else v)
                   for k, v in res.items() if isinstance(v, float)}, flush=True)
        del tok, head
        torch.cuda.empty_cache()
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows_out}, open(sys.argv[1], "w"),
              indent=1)


main()
