"""How close decode attention (one split, longest first) is to only reading its K/V: the same
programs and page-table gathers summing the tiles instead of attending. Qwen3-8B heads, bf16,
contexts of 100-2,047 tokens in scattered slots, CUDA graphs.

    python probe_attn_readonly.py OUT.json
"""
import json
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, "python")
from minisgl.kernel.triton.decode_attention import decode_attention, longest_first  # noqa: E402

HQ, HKV, D = 32, 8, 128


@triton.jit
def read_only(K, V, PageTable, Rows, SeqLens, Order, Out, stride_kn, stride_kh, stride_pt,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, INDIRECT: tl.constexpr):
    kvh = tl.program_id(0)
    b = tl.load(Order + tl.program_id(1))
    seq_len = tl.load(SeqLens + b)
    row = tl.load(Rows + b).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    base = tl.load(PageTable + row * stride_pt).to(tl.int64)
    for n in range(0, seq_len, BLOCK_N):
        pos = n + offs_n
        valid = pos < seq_len
        if INDIRECT:
            slot = tl.load(PageTable + row * stride_pt + pos, mask=valid, other=0).to(tl.int64)
        else:
            slot = base + pos
        ptr = slot[:, None] * stride_kn + kvh * stride_kh + offs_d[None, :]
        k = tl.load(K + ptr, mask=valid[:, None], other=0.0)
        v = tl.load(V + ptr, mask=valid[:, None], other=0.0)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(Out + (b * 8 + kvh) * BLOCK_D + offs_d, tl.sum(acc, 0))


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median") * 1e3


def main():
    gen = torch.Generator().manual_seed(1)
    rows_out = []
    for bs in (64, 128, 256):
        for layout in ("scattered", "contiguous"):
            lens = torch.randint(100, 2048, (bs,), generator=gen).tolist()
            total = sum(lens)
            kc = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            slots = (torch.randperm(total, generator=gen) if layout == "scattered"
                     else torch.arange(total)).to(torch.int32)
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
            ro = torch.empty(bs * HKV * D, device="cuda")
            res = {"batch": bs, "layout": layout}
            res["attention"] = graph_us(lambda: decode_attention(q, kc, vc, table, rows, sl,
                                                                 D**-0.5, 1, out=out, order=order))
            for bn, w, st in ((128, 4, 2), (64, 4, 3), (128, 8, 3)):
                for ind in ((True, False) if layout == "contiguous" else (True,)):
                    res[f"read_{bn}_{w}_{st}{'' if ind else '_noindex'}"] = graph_us(
                        lambda bn=bn, w=w, st=st, ind=ind: read_only[(HKV, bs)](
                            kc, vc, table, rows, sl, order, ro, kc.stride(0), kc.stride(1),
                            table.stride(0), BLOCK_N=bn, BLOCK_D=D, INDIRECT=ind, num_warps=w,
                            num_stages=st))
            gb = total * HKV * D * 4 / 1e6
            rows_out.append(res)
            print(bs, layout, {k: f"{v:.1f}us {gb / v:.2f}" for k, v in res.items()
                               if isinstance(v, float)}, flush=True)
            del kc, vc
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows_out}, open(sys.argv[1], "w"),
              indent=1)


main()
