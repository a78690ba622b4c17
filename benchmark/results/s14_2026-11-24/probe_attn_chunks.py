"""Decode attention cut into fixed-size chunks of context (every program the same work), emulated
with today's kernel: each chunk of C tokens is a request of its own (one split, so the kernel
writes its normalised output), next to the requests whole. Stage 2's merge is timed apart with
the existing merge kernel over as many splits as the longest request has chunks.

    python probe_attn_chunks.py OUT.json
"""
import json
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, "python")
from minisgl.kernel.triton.decode_attention import _decode_stage2, decode_attention  # noqa: E402

HQ, HKV, D = 32, 8, 128


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median") * 1e3


def pseudo(lens, chunk, order):
    """(page table, seq_lens) of the chunks as requests, slots contiguous per real request."""
    items, start = [], 0
    for n in lens:
        for s in range(0, n, chunk):
            items.append((start + s, min(chunk, n - s)))
        start += n
    if order == "desc":
        items.sort(key=lambda it: -it[1])
    width = max(n for _, n in items)
    table = torch.zeros(len(items), width, dtype=torch.int32)
    for i, (s, n) in enumerate(items):
        table[i, :n] = torch.arange(s, s + n, dtype=torch.int32)
    return table.cuda(), torch.tensor([n for _, n in items], dtype=torch.int32, device="cuda")


def time_attn(kc, vc, table, sl):
    n = table.shape[0]
    q = torch.randn(n, HQ, D, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    rows = torch.arange(n, dtype=torch.int32, device="cuda")
    return graph_us(lambda: decode_attention(q, kc, vc, table, rows, sl, D**-0.5, 1, out=out))


def time_merge(lens, splits):
    bs = len(lens)
    po = torch.randn(bs, HQ, splits, D, device="cuda")
    pl = torch.randn(bs, HQ, splits, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.empty(bs, HQ, D, device="cuda", dtype=torch.bfloat16)

    def merge():
        _decode_stage2[(bs, HQ)](po, pl, sl, out, splits, po.stride(0), po.stride(1),
                                 po.stride(2), pl.stride(0), pl.stride(1), out.stride(0),
                                 out.stride(1), HEAD_DIM=D, BLOCK_D=D, BLOCK_N=64,
                                 SPLITS_PAD=triton.next_power_of_2(splits), num_warps=4,
                                 USE_PDL=False)
    return graph_us(merge)


def main():
    rows = []
    g = torch.Generator().manual_seed(0)
    for bs in (32, 64, 128, 192, 256):
        lens = torch.randint(100, 2048, (bs,), generator=g).tolist()
        total = sum(lens)
        kc = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        gb = total * HKV * D * 4 / 1e6
        res = {"batch": bs, "mean_len": total // bs}
        res["whole"] = time_attn(kc, vc, *pseudo(lens, 1 << 30, "given"))
        mean = total // bs
        res["uniform"] = time_attn(kc, vc, *pseudo([mean] * bs, 1 << 30, "given"))
        for chunk in (128, 256, 512):
            for order in ("given", "desc"):
                res[f"c{chunk}_{order}"] = time_attn(kc, vc, *pseudo(lens, chunk, order))
            res[f"merge_c{chunk}"] = time_merge(lens, -(-max(lens) // chunk))
        rows.append(res)
        print(bs, total // bs, {k: f"{v:.1f}us" + ("" if k.startswith("merge") else
                                                  f" {gb / v:.2f}TB/s")
                                for k, v in res.items() if isinstance(v, float)}, flush=True)
        del kc, vc
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(sys.argv[1], "w"),
              indent=1)


main()
