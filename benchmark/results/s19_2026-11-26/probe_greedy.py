"""Greedy sampling of a decode step, in a CUDA graph of 64 calls (us per call): torch's argmax, the
int32 cast and the token pool's index-put (the engine's path outside the graph) against
``greedy_to_pool`` at several splits per row. Vocabulary 151,936 (Qwen3), bf16 logits."""
import json

import torch

from minisgl.kernel.triton.decode_step import greedy_to_pool, pick_splits

V, N = 151936, 64


def timed(fn) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(N):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / N)
    return best


rows_out = []
for b in (1, 2, 8, 32, 64, 256):
    logits = torch.randn(b, V, device="cuda").to(torch.bfloat16)
    pool = torch.zeros(512, 4096, dtype=torch.int32, device="cuda")
    rows = torch.arange(b, device="cuda")
    pos = torch.full((b,), 7, device="cuda")
    flag = torch.ones(1, dtype=torch.int64, device="cuda")
    out = torch.empty(b, dtype=torch.int64, device="cuda")

    def torch_path():
        t = logits.argmax(dim=-1)
        pool[rows, pos] = t.to(torch.int32)

    res = {"batch": b, "torch_argmax_cast_index_put": round(timed(torch_path), 2),
           "torch_argmax": round(timed(lambda: logits.argmax(dim=-1)), 2)}
    for splits in (1, 4, 8, 16, 32, 64):
        for block in (1024, 2048):
            res[f"greedy_s{splits}_b{block}"] = round(timed(
                lambda: greedy_to_pool(logits, flag, rows, pos, pool, out, splits, block)), 2)
    res["greedy_default"] = round(timed(lambda: greedy_to_pool(logits, flag, rows, pos, pool, out)), 2)
    res["default_splits"] = pick_splits(b)
    flag.zero_()
    res["greedy_flag0"] = round(timed(lambda: greedy_to_pool(logits, flag, rows, pos, pool, out)), 2)
    flag.fill_(1)
    greedy_to_pool(logits, flag, rows, pos, pool, out)
    assert torch.equal(out, logits.argmax(dim=-1))
    print(json.dumps(res), flush=True)
