"""Sliding windows and attention sinks: the Triton kernels and backends against a float64 dense
reference and against the torch backend, through ``AttentionSpec``.

Without a GPU the kernels run under the Triton interpreter in float32/float16. Windows are chosen
smaller and larger than a kernel block, so rows of one block see different first keys, some rows
see no key of a whole block, and a request shorter than its window sees everything.
"""

from __future__ import annotations

import pytest
import torch

from helpers.attention_reference import reference
from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.attention import create_attention_backend
from minisgl.attention.torch_backend import TorchBackend
from minisgl.attention.triton_backend import TritonBackend
from minisgl.core import Batch, Feed, Req, SamplingParams
from minisgl.kernel.triton.decode_attention import decode_attention
from minisgl.kernel.triton.extend_attention import extend_attention
from minisgl.kvcache.mha_pool import MHAKVCache
from minisgl.kvcache.spec import AttentionSpec

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.float16: 2e-3}


def paged(seq_lens, hkv, dim, dtype, gen):
    num_slots = sum(seq_lens) + 16
    k = torch.randn(num_slots, hkv, dim, generator=gen).to(dtype).to(DEV)
    v = torch.randn(num_slots, hkv, dim, generator=gen).to(dtype).to(DEV)
    perm = torch.randperm(num_slots, generator=gen)
    table = torch.zeros(len(seq_lens) + 1, max(seq_lens) + 3, dtype=torch.int32)
    slots_of, used = [], 0
    for b, n in enumerate(seq_lens):
        table[b, :n] = perm[used: used + n].to(torch.int32)
        slots_of.append(perm[used: used + n].to(DEV))
        used += n
    rows = torch.arange(len(seq_lens), dtype=torch.int32, device=DEV)
    return k, v, table.to(DEV), rows, slots_of


@pytest.mark.parametrize("window,with_sinks", [(5, False), (40, True), (0, True), (200, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_kernel_window_sinks(dtype, window, with_sinks):
    gen = torch.Generator().manual_seed(window + with_sinks)
    hq, hkv, dim = 8, 2, 64
    seq_lens = [1, 7, 64, 130]
    k, v, table, rows, slots_of = paged(seq_lens, hkv, dim, dtype, gen)
    q = torch.randn(len(seq_lens), hq, dim, generator=gen).to(dtype).to(DEV)
    sinks = torch.randn(hq, generator=gen).to(DEV) * 2 if with_sinks else None
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    ref = reference(q.unsqueeze(1), k, v, slots_of, [n - 1 for n in seq_lens], 0.2, window,
                    sinks)
    for splits in (1, 3, 8):
        out = decode_attention(q, k, v, table, rows, lens, 0.2, splits, window=window,
                               sinks=sinks)
        torch.testing.assert_close(out.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("window,with_sinks", [(3, True), (20, False), (45, True), (0, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_kernel_window_sinks(dtype, window, with_sinks):
    gen = torch.Generator().manual_seed(window * 3 + with_sinks)
    hq, hkv, dim = 4, 2, 32
    extend, cached = [1, 37, 5, 70], [0, 19, 64, 3]
    seq_lens = [e + c for e, c in zip(extend, cached)]
    k, v, table, rows, slots_of = paged(seq_lens, hkv, dim, dtype, gen)
    q = torch.randn(sum(extend), hq, dim, generator=gen).to(dtype).to(DEV)
    sinks = torch.randn(hq, generator=gen).to(DEV) if with_sinks else None
    cu = [0] + torch.tensor(extend).cumsum(0).tolist()
    out = extend_attention(q, k, v, table, rows, torch.tensor(cu, dtype=torch.int32, device=DEV),
                           torch.tensor(seq_lens, dtype=torch.int32, device=DEV), max(extend),
                           0.3, window=window, sinks=sinks)
    qs = [q[cu[b]: cu[b + 1]] for b in range(len(extend))]
    ref = reference(qs, k, v, slots_of, cached, 0.3, window, sinks)
    torch.testing.assert_close(out.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])


# -- the backends, through AttentionSpec --------------------------------------------------------


def scene(cached, extend, spec: AttentionSpec, dtype, page_size, seed):
    """A two-layer pool (the spec's layer is 1), requests at (cached, extend), random pages."""
    gen = torch.Generator().manual_seed(seed)
    total = [c + e for c, e in zip(cached, extend)]
    pages_per = [-(-t // page_size) for t in total]
    num_pages = sum(pages_per) + 2
    pool = MHAKVCache(2, spec.num_kv_heads, spec.head_dim, num_pages, page_size, dtype, DEV)
    for buf in (pool.k_cache(1), pool.v_cache(1)):
        buf.copy_(torch.randn(buf.shape, generator=gen))
    table = torch.zeros(len(total) + 1, max(total) + 4, dtype=torch.int32, device=DEV)
    pages = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    reqs = []
    for i, (c, t) in enumerate(zip(cached, total)):
        mine = [pages.pop() for _ in range(pages_per[i])]
        slots = torch.tensor([p * page_size + o for p in mine for o in range(page_size)])[:t]
        table[i, :t] = slots.to(torch.int32).to(DEV)
        reqs.append(Req(uid=i, input_ids=[5] * (t + 1), prompt_len=t + 1,
                        sampling_params=SamplingParams(), max_device_len=t + 4, table_idx=i,
                        cached_len=c, device_len=t))
    phase = "decode" if all(e == 1 for e in extend) else "prefill"
    batch = Batch([Feed.of(r) for r in reqs], phase)
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
    pos = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    batch.out_loc = table[rows.to(DEV), pos.to(DEV)]
    n = len(rows)
    q, kk, vv = (torch.randn(n, h, spec.head_dim, generator=gen).to(dtype).to(DEV)
                 for h in (spec.num_qo_heads, spec.num_kv_heads, spec.num_kv_heads))
    pool.store_kv(kk, vv, batch.out_loc, 1)
    return pool, table, batch, (q, kk, vv)


def run(backend, batch, qkv, spec):
    backend.check_layers([spec])
    backend.prepare_metadata(batch)
    return backend.forward(*qkv, spec, batch)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("cached,extend", [([0, 8, 16, 4], [12, 1, 9, 30]),
                                           ([0, 8, 70, 3], [1, 1, 1, 1])])
def test_backends_window_and_sinks(cached, extend, page_size):
    gen = torch.Generator().manual_seed(11)
    spec = AttentionSpec(kv_layer=1, num_qo_heads=8, num_kv_heads=2, head_dim=32, scale=0.17,
                         sliding_window=6, sinks=torch.randn(8, generator=gen).to(DEV))
    pool, table, batch, qkv = scene(cached, extend, spec, torch.float32, page_size, seed=3)
    ref_backend = TorchBackend(pool, table)
    ref = run(ref_backend, batch, qkv, spec)
    # the torch backend itself against the dense reference
    slots_of = [table[r.table_idx, : r.device_len].long() for r in batch.feeds]
    cu = [0] + torch.tensor(extend).cumsum(0).tolist()
    qs = [qkv[0][cu[b]: cu[b + 1]] for b in range(len(extend))]
    dense = reference(qs, pool.k_cache(1), pool.v_cache(1), slots_of, cached, 0.17, 6,
                      spec.sinks)
    torch.testing.assert_close(ref.double(), dense, atol=1e-5, rtol=1e-5)
    out = run(TritonBackend(pool, table), batch, qkv, spec)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_torch_backend_softcap():
    spec = AttentionSpec(kv_layer=1, num_qo_heads=4, num_kv_heads=4, head_dim=16, scale=0.5,
                         logit_softcap=2.0)
    pool, table, batch, qkv = scene([3, 0], [5, 9], spec, torch.float32, 1, seed=5)
    out = run(TorchBackend(pool, table), batch, qkv, spec)
    slots_of = [table[r.table_idx, : r.device_len].long() for r in batch.feeds]
    q = qkv[0]
    outs = []
    for b, (qb, slots, c) in enumerate(zip((q[:5], q[5:]), slots_of, (3, 0))):
        s = torch.einsum("thd,shd->hts", qb.double(), pool.k_cache(1)[slots].double()) * 0.5
        s = torch.tanh(s / 2.0) * 2.0
        causal = (torch.arange(len(slots))[None] <= (c + torch.arange(qb.shape[0]))[:, None]
                  ).to(s.device)
        p = s.masked_fill(~causal, float("-inf")).softmax(-1)
        outs.append(torch.einsum("hts,shd->thd", p, pool.v_cache(1)[slots].double()))
    torch.testing.assert_close(out.double(), torch.cat(outs), atol=1e-5, rtol=1e-5)


def test_unsupported_features_are_refused_at_start():
    spec = AttentionSpec(kv_layer=0, num_qo_heads=4, num_kv_heads=2, head_dim=16, scale=0.25,
                         logit_softcap=30.0)
    pool = MHAKVCache(1, 2, 16, 4, 1, torch.float32, DEV)
    table = torch.zeros(2, 8, dtype=torch.int32, device=DEV)
    for name in ("triton", "torch,triton"):
        backend = create_attention_backend(name, pool, table)
        with pytest.raises(ValueError, match="logit soft-capping"):
            backend.check_layers([spec])
    create_attention_backend("torch", pool, table).check_layers([spec])


def test_spec_validation():
    with pytest.raises(ValueError, match="sliding_window"):
        AttentionSpec(0, 4, 2, 16, 0.25, sliding_window=0)
    with pytest.raises(ValueError, match="num_qo_heads"):
        AttentionSpec(0, 3, 2, 16, 0.25)
    with pytest.raises(ValueError, match="scale"):
        AttentionSpec(0, 4, 2, 16, 0.0)


def test_pool_with_per_layer_shapes():
    """Gemma 4's layout: local layers (8 KV heads of 16) beside a global one (2 of 64)."""
    shapes = [(8, 16), (8, 16), (2, 64), (8, 16)]
    pool = MHAKVCache(4, 8, 64, 5, 2, torch.float32, "cpu", layer_shapes=shapes)
    assert [tuple(pool.k_cache(i).shape) for i in range(4)] == [(10, h, d) for h, d in shapes]
    assert pool.mem_bytes == sum(2 * 10 * h * d * 4 for h, d in shapes)
    k, v = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    pool.store_kv(k, v, torch.tensor([1, 4, 9]), 2)
    assert torch.equal(pool.v_cache(2)[[1, 4, 9]], v)
    assert pool.k_cache(3).abs().sum() == 0  # other layers untouched
    with pytest.raises(ValueError, match="layer_shapes"):
        MHAKVCache(2, 8, 64, 5, 2, torch.float32, "cpu", layer_shapes=shapes)


@pytest.mark.gpu
@pytest.mark.parametrize("dim,heads,window", [(256, (16, 8), 1024), (512, (16, 2), 0),
                                              (64, (64, 8), 128)])
def test_real_sizes_bf16(dim, heads, window):
    """Gemma 4's local (256, 8 KV heads, window 1024) and global (512, 2 KV heads) layers and a
    gpt-oss-like one (64, window 128, sinks) in bf16 on the GPU, over 3k-token contexts."""
    gen = torch.Generator().manual_seed(dim)
    hq, hkv = heads
    extend, cached = [700, 1, 300], [2300, 3000, 0]
    seq_lens = [e + c for e, c in zip(extend, cached)]
    k, v, table, rows, slots_of = paged(seq_lens, hkv, dim, torch.bfloat16, gen)
    sinks = torch.randn(hq, generator=gen).to(DEV) if dim == 64 else None
    q = torch.randn(sum(extend), hq, dim, generator=gen).to(torch.bfloat16).to(DEV)
    cu = [0] + torch.tensor(extend).cumsum(0).tolist()
    out = extend_attention(q, k, v, table, rows, torch.tensor(cu, dtype=torch.int32, device=DEV),
                           torch.tensor(seq_lens, dtype=torch.int32, device=DEV), max(extend),
                           dim**-0.5, window=window, sinks=sinks)
    ref = reference([q[cu[b]: cu[b + 1]] for b in range(3)], k, v, slots_of, cached, dim**-0.5,
                    window, sinks)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    qd = q[torch.tensor(cu[1:]) - 1]
    for splits in (1, 8):
        got = decode_attention(qd, k, v, table, rows, lens, dim**-0.5, splits, window=window,
                               sinks=sinks)
        want = reference(qd.unsqueeze(1), k, v, slots_of, [n - 1 for n in seq_lens],
                         dim**-0.5, window, sinks)
        torch.testing.assert_close(got.double(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("given_out", [False, True])
def test_triton_backend_zeroes_padding_rows(given_out):
    """A prefill padded to ``pad_tokens`` (the engine's dummy rows after the requests' tokens):
    the padding rows of the output are zeros, not whatever the buffer held (stale memory may be
    NaN, and a NaN row reaching the MoE router picked an expert id past the last)."""
    spec = AttentionSpec(kv_layer=1, num_qo_heads=4, num_kv_heads=2, head_dim=32, scale=0.2,
                         sliding_window=6)
    pool, table, batch, (q, k, v) = scene([0, 5], [9, 4], spec, torch.float32, 1, seed=5)
    backend = TritonBackend(pool, table)
    want = run(backend, batch, (q, k, v), spec)
    pad = 3
    q, k, v = (torch.cat([t, torch.full((pad, *t.shape[1:]), float("nan"), device=DEV)])
               for t in (q, k, v))
    out = torch.full_like(q, float("nan")) if given_out else None
    backend.prepare_metadata(batch)
    got = backend.forward(q, k, v, spec, batch, out)
    torch.testing.assert_close(got[:-pad], want)
    assert torch.equal(got[-pad:], torch.zeros_like(got[-pad:]))
