"""Decode attention, one split: does launching the programs longest request first help, with
the KV heads of a request next to each other in the grid (``grid (Hkv, B)``, program ``(h, i)``
serves request ``order[i]``), against today's ``grid (B, Hkv)``? Qwen3-8B heads, bf16, CUDA
graphs; the workload's spread of context lengths (100-2,047).

    python probe_attn_lpt.py OUT.json
"""
import json
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, "python")
from minisgl.kernel.triton.decode_attention import decode_attention  # noqa: E402
from minisgl.kernel.triton.extend_attention import _attend_keys  # noqa: E402
from minisgl.kernel.triton.pdl import wait_then_release  # noqa: E402

HQ, HKV, D = 32, 8, 128
LOG2E = 1.4426950408889634


@triton.jit
def stage1(Q, K, V, PageTable, Rows, SeqLens, Order, Out, qk_scale,
           stride_qb, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_pt,
           stride_ob, stride_oh, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
           BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_FIRST: tl.constexpr,
           USE_PDL: tl.constexpr):
    wait_then_release(USE_PDL)
    if HEAD_FIRST:
        kvh = tl.program_id(0)
        b = tl.load(Order + tl.program_id(1))
    else:
        b = tl.load(Order + tl.program_id(0))
        kvh = tl.program_id(1)
    seq_len = tl.load(SeqLens + b)
    row = tl.load(Rows + b).to(tl.int64)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < BLOCK_D
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    acc, m_i, l_i = _attend_keys(
        acc, m_i, l_i, q, offs_g, K, V, PageTable + row * stride_pt, kvh, 0, seq_len, qk_scale,
        stride_kn, stride_kh, stride_vn, stride_vh, d_mask,
        BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, CAUSAL=False, DOT_PREC="tf32")
    tl.store(Out + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


def lpt_attention(q, kc, vc, table, rows, sl, order, out, head_first, cfg=(64, 4, 3)):
    bs = q.shape[0]
    grid = (HKV, bs) if head_first else (bs, HKV)
    stage1[grid](q, kc, vc, table, rows, sl, order, out, D**-0.5 * LOG2E,
                 q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), vc.stride(0),
                 vc.stride(1), table.stride(0), out.stride(0), out.stride(1),
                 GROUP=HQ // HKV, GROUP_PAD=16, BLOCK_D=D, BLOCK_N=cfg[0], HEAD_FIRST=head_first,
                 num_warps=cfg[1], num_stages=cfg[2], USE_PDL=True, launch_pdl=True)
    return out


def graph_us(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, return_mode="median") * 1e3


def main():
    gen = torch.Generator().manual_seed(0)
    rows_out = []
    for bs in (32, 64, 96, 128, 192, 256):
        for kind in ("random", "uniform"):
            lens = torch.randint(100, 2048, (bs,), generator=gen).tolist()
            if kind == "uniform":
                lens = [sum(lens) // bs] * bs
            total = sum(lens)
            kc = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            table = torch.zeros(bs, max(lens), dtype=torch.int32)
            start = 0
            perm = torch.randperm(bs, generator=gen).tolist()  # slots not in batch order
            starts = {}
            for i in perm:
                starts[i] = start
                start += lens[i]
            for i, n in enumerate(lens):
                table[i, :n] = torch.arange(starts[i], starts[i] + n, dtype=torch.int32)
            table = table.cuda()
            rows = torch.arange(bs, dtype=torch.int32, device="cuda")
            sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
            q = torch.randn(bs, HQ, D, device="cuda", dtype=torch.bfloat16)
            out = torch.empty_like(q)
            ident = torch.arange(bs, dtype=torch.int32, device="cuda")
            desc = torch.tensor(sorted(range(bs), key=lambda i: -lens[i]), dtype=torch.int32,
                                device="cuda")
            ref = decode_attention(q, kc, vc, table, rows, sl, D**-0.5, 1).float()
            res = {"batch": bs, "lens": kind, "mean_len": total // bs}
            res["today"] = graph_us(lambda: decode_attention(q, kc, vc, table, rows, sl, D**-0.5,
                                                             1, out=out))
            for name, order, hf in (("b_major", ident, False), ("head_first", ident, True),
                                    ("b_major_lpt", desc, False), ("head_first_lpt", desc, True)):
                o = lpt_attention(q, kc, vc, table, rows, sl, order, torch.empty_like(q), hf)
                assert (o.float() - ref).abs().max().item() < 2e-2
                res[name] = graph_us(lambda: lpt_attention(q, kc, vc, table, rows, sl, order,
                                                           out, hf))
            for cfg in ((64, 4, 2), (32, 4, 4), (128, 8, 2)):
                res[f"head_first_lpt_{cfg}"] = graph_us(
                    lambda: lpt_attention(q, kc, vc, table, rows, sl, desc, out, True, cfg))
            gb = total * HKV * D * 4 / 1e6
            rows_out.append(res)
            print(bs, kind, total // bs, {k: f"{v:.1f}us {gb / v:.2f}TB/s" for k, v in res.items()
                                          if isinstance(v, float)}, flush=True)
            del kc, vc
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows_out}, open(sys.argv[1], "w"),
              indent=1)


main()
