"""Decode attention with the offline workload's spread of context lengths: does the order of the
requests (longest first), or split-K, change the time? Qwen3-8B heads, bf16, CUDA-graph timings.

    python probe_attn_balance.py OUT.json
"""
import json
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, "python")
from minisgl.kernel.triton.decode_attention import decode_attention  # noqa: E402

HQ, HKV, D = 32, 8, 128


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median") * 1e3


def case(lens, splits, order=None):
    bs = len(lens)
    total = int(sum(lens))
    maxlen = max(lens)
    if order is not None:
        lens = [lens[i] for i in order]
    kc = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.zeros(bs, maxlen, dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(lens):
        table[i, :n] = torch.arange(start, start + n, dtype=torch.int32, device="cuda")
        start += n
    rows = torch.arange(bs, dtype=torch.int32, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(bs, HQ, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    t = graph_us(lambda: decode_attention(q, kc, vc, table, rows, sl, D**-0.5, splits, out=out))
    nbytes = total * HKV * D * 2 * 2
    return t, nbytes / t / 1e6


def main():
    rows = []
    g = torch.Generator().manual_seed(0)
    for bs in (32, 64, 128, 192, 256):
        lens = torch.randint(100, 2048, (bs,), generator=g).tolist()
        mean = sum(lens) // bs
        desc = sorted(range(bs), key=lambda i: -lens[i])
        asc = desc[::-1]
        res = {"batch": bs, "mean_len": mean, "max_len": max(lens)}
        res["uniform_s1"] = case([mean] * bs, 1)
        for s in (1, 2, 4):
            res[f"random_s{s}"] = case(lens, s)
            res[f"desc_s{s}"] = case(lens, s, desc)
        res["asc_s1"] = case(lens, 1, asc)
        rows.append(res)
        print(bs, mean, {k: f"{v[0]:.1f}us {v[1]:.2f}TB/s" for k, v in res.items()
                         if isinstance(v, tuple)}, flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[1], "w"),
              indent=1)


main()
