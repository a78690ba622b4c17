"""The Triton attention kernels and backends against dense torch references.

Without a GPU the kernels run on CPU tensors under the Triton interpreter, at small sizes and in
float32/float16 (the interpreter's bf16 ``tl.dot`` is wrong); with a GPU the same tests run
compiled, and the ``gpu`` tests add real sizes in bf16/fp32, CUDA-graph replay and engine parity.
Page tables are random permutations of slots, so a kernel that assumes contiguous K/V fails.
"""

from __future__ import annotations

import sys

import pytest
import torch

from helpers.interpreter import import_triton
from helpers.paged_scene import PagedScene

triton = import_triton()

from minisgl.attention import create_attention_backend, resolve_attention_backend
from minisgl.attention.torch_backend import TorchBackend
from minisgl.attention.triton_backend import TritonBackend
from minisgl.core import Batch, Feed, SamplingParams
from minisgl.engine.graph import dummy_decode_batch
from minisgl.kernel.triton.decode_attention import decode_attention, longest_first
from minisgl.kernel.triton.extend_attention import extend_attention
from minisgl.kvcache.spec import AttentionSpec

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
HEADS = [(4, 4), (8, 4), (8, 2)]  # (q heads, kv heads): GQA ratios 1, 2, 4


def dense_reference(q, k_cache, v_cache, page_table, rows, cu, seq_lens, scale):
    """Float64 attention of each request's new tokens over its gathered context."""
    outs = []
    for b in range(len(rows)):
        qb = q[cu[b] : cu[b + 1]].double()
        ext, seq = qb.shape[0], int(seq_lens[b])
        slots = page_table[rows[b], :seq].long()
        group = q.shape[1] // k_cache.shape[1]
        k = k_cache[slots].double().repeat_interleave(group, 1)
        v = v_cache[slots].double().repeat_interleave(group, 1)
        s = torch.einsum("thd,shd->hts", qb, k) * scale
        causal = torch.arange(seq)[None, :] <= (seq - ext + torch.arange(ext))[:, None]
        s = s.masked_fill(~causal.to(s.device), float("-inf"))
        outs.append(torch.einsum("hts,shd->thd", s.softmax(-1), v))
    return torch.cat(outs)


def paged_cache(seq_lens, hkv, dim, dtype, gen, extra_rows=3):
    """Random K/V pool and a page table whose rows hold random, non-contiguous slots."""
    num_slots = sum(seq_lens) + 64
    k = torch.randn(num_slots, hkv, dim, generator=gen).to(dtype).to(DEV)
    v = torch.randn(num_slots, hkv, dim, generator=gen).to(dtype).to(DEV)
    perm = torch.randperm(num_slots, generator=gen)
    nrows = len(seq_lens) + extra_rows
    table = torch.zeros(nrows, max(seq_lens) + 5, dtype=torch.int32)
    rows = torch.randperm(nrows, generator=gen)[: len(seq_lens)].to(torch.int32)
    used = 0
    for row, n in zip(rows.tolist(), seq_lens):
        table[row, :n] = perm[used : used + n].to(torch.int32)
        used += n
    return k, v, table.to(DEV), rows.to(DEV)


# -- kernels vs a dense reference --------------------------------------------------------------


# each case takes 7-12 s in the interpreter: two run by default (both dtypes, the first and the
# last head layout), the rest with the slow tests
@pytest.mark.parametrize("dtype,heads,dim", [
    pytest.param(dtype, heads, dim, id=f"dtype{i}-heads{j}-{dim}",
                 marks=() if (i, j, dim) in ((0, 0, 64), (1, len(HEADS) - 1, 128))
                 else pytest.mark.slow)
    for i, dtype in enumerate([torch.float32, torch.float16])
    for j, heads in enumerate(HEADS) for dim in (64, 128)])
def test_decode_kernel(dtype, heads, dim):
    hq, hkv = heads
    gen = torch.Generator().manual_seed(hq * 7 + hkv + dim)
    seq_lens = [1, 7, 64, 130]
    k, v, table, rows = paged_cache(seq_lens, hkv, dim, dtype, gen)
    q = torch.randn(len(seq_lens), hq, dim, generator=gen).to(dtype).to(DEV)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    cu = list(range(len(seq_lens) + 1))
    ref = dense_reference(q, k, v, table, rows, cu, lens, dim**-0.5)
    order = torch.tensor(longest_first(seq_lens), dtype=torch.int32, device=DEV)
    assert order.tolist() == [3, 2, 1, 0]
    # 8 splits of 64-token chunks leave most splits of short requests empty
    for splits in (1, 3, 8):
        out = torch.full_like(q, float("nan"))
        decode_attention(q, k, v, table, rows, lens, dim**-0.5, splits, out=out)
        torch.testing.assert_close(out.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])
        # the launch order is a schedule, not a computation: the same bits in any order
        ordered = decode_attention(q, k, v, table, rows, lens, dim**-0.5, splits, order=order)
        assert torch.equal(ordered, out)


def test_longest_first():
    assert longest_first([5, 40, 5, 90, 1]) == [3, 1, 0, 2, 4]  # ties keep batch order
    assert longest_first([]) == []


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("prefix", [False, True])
def test_extend_kernel(prefix, dtype, heads, dim):
    hq, hkv = heads
    gen = torch.Generator().manual_seed(hq * 5 + hkv + dim + prefix)
    extend = [1, 37, 5, 70]
    cached = [0, 19, 64, 3] if prefix else [0] * 4
    seq_lens = [e + c for e, c in zip(extend, cached)]
    k, v, table, rows = paged_cache(seq_lens, hkv, dim, dtype, gen)
    q = torch.randn(sum(extend), hq, dim, generator=gen).to(dtype).to(DEV)
    cu = torch.tensor([0] + torch.tensor(extend).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEV)
    out = torch.full_like(q, float("nan"))
    extend_attention(q, k, v, table, rows, cu, lens, max(extend), dim**-0.5, out=out)
    ref = dense_reference(q, k, v, table, rows, cu.tolist(), lens, dim**-0.5)
    torch.testing.assert_close(out.double(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_head_dim_not_a_power_of_two():
    gen = torch.Generator().manual_seed(3)
    k, v, table, rows = paged_cache([9, 40], 2, 48, torch.float32, gen)
    q = torch.randn(2, 4, 48, generator=gen).to(DEV)
    lens = torch.tensor([9, 40], dtype=torch.int32, device=DEV)
    out = decode_attention(q, k, v, table, rows, lens, 0.3, 2)
    ref = dense_reference(q, k, v, table, rows, [0, 1, 2], lens, 0.3)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)


# -- the backends, through the engine's interface ----------------------------------------------


class Scene(PagedScene):
    """``PagedScene`` with one plain layer's spec."""

    def __init__(self, cached, extend, hq, hkv, dim, dtype, page_size=1, seed=0, device=DEV):
        super().__init__(cached, extend, hq, hkv, dim, dtype, page_size, seed, device)
        self.spec = AttentionSpec(0, hq, hkv, dim, dim**-0.5)  # one plain layer

    def batch(self, phase: str) -> tuple[Batch, tuple[torch.Tensor, ...]]:
        batch = Batch([Feed.of(r) for r in self.reqs], phase)
        rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in self.reqs])
        pos = torch.cat([torch.arange(r.cached_len, r.device_len) for r in self.reqs])
        dev = self.page_table.device
        batch.out_loc = self.page_table[rows.to(dev), pos.to(dev)]
        n = len(rows)
        qkv = [torch.randn(n, h, self.dim, generator=self.gen).to(self.dtype).to(self.pool.device)
               for h in (self.hq, self.hkv, self.hkv)]
        return batch, tuple(qkv)

    def run(self, backend, batch, qkv):
        backend.prepare_metadata(batch)
        self.pool.store_kv(qkv[1], qkv[2], batch.out_loc, 0)  # the attention layer's job
        return backend.forward(*qkv, self.spec, batch)


def compare_backends(scene: Scene, phase: str, name: str = "triton", tol: float | None = None):
    batch, qkv = scene.batch(phase)
    ours = create_attention_backend(name, scene.pool, scene.page_table)
    out = scene.run(ours, batch, qkv)
    ref = scene.run(TorchBackend(scene.pool, scene.page_table), batch, qkv)
    tol = tol or TOL[scene.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
    return ours, batch, qkv, out


@pytest.mark.parametrize("page_size", [1, 4])
def test_backend_prefill_with_prefix(page_size):
    scene = Scene([0, 8, 16, 4], [12, 1, 9, 30], 8, 2, 64, torch.float32, page_size, seed=1)
    compare_backends(scene, "prefill")


@pytest.mark.parametrize("page_size", [1, 4])
def test_backend_decode(page_size):
    scene = Scene([0, 8, 16, 70, 3], [1] * 5, 8, 4, 64, torch.float16, page_size, seed=2)
    ours, batch, _, _ = compare_backends(scene, "decode")
    ours.prepare_metadata(batch)  # the kernel's launch order: longest context first
    assert batch.attn_metadata.order.tolist() == [3, 2, 1, 4, 0]


@pytest.mark.parametrize("decode_kernel", [True, False])
@pytest.mark.parametrize("page_size", [1, 4])
def test_backend_mixed_batch(page_size, decode_kernel):
    """Decode rows first (one token each), then prefill chunks with and without a prefix; the
    decode rows go through the decode kernel or, as one-token extends, the extend kernel."""
    scene = Scene([8, 70, 3, 0, 16], [1, 1, 1, 12, 9], 8, 2, 64, torch.float32, page_size, seed=8)
    batch, qkv = scene.batch("mixed")
    batch.num_decode = 3
    backend = TritonBackend(scene.pool, scene.page_table)
    backend.mixed_decode_kernel = decode_kernel
    out = scene.run(backend, batch, qkv)
    assert type(batch.attn_metadata).__name__ == (
        "TritonMixedMetadata" if decode_kernel else "TritonPrefillMetadata")
    ref = scene.run(TorchBackend(scene.pool, scene.page_table), batch, qkv)
    torch.testing.assert_close(out, ref, atol=TOL[torch.float32], rtol=TOL[torch.float32])


def graph_bufs(backend, static, bs: int) -> torch.Tensor:
    """The static metadata the graph runner gives a captured size: its rows for ``static``."""
    return torch.tensor(backend.replay_metadata(static, bs), dtype=torch.int32,
                        device=backend.device)


def refill(backend, bufs: torch.Tensor, batch) -> None:
    """What a replay's copy does: ``batch``'s rows, padded to the captured size."""
    bufs.copy_(torch.tensor(backend.replay_metadata(batch, bufs.shape[1]), dtype=torch.int32))


def test_graph_contract_pads_with_the_dummy_row():
    """Replay metadata: live rows give the eager result; padding rows attend over slot 0 only."""
    scene = Scene([5, 40, 90], [1, 1, 1], 8, 4, 64, torch.float32, seed=2)
    backend, batch, qkv, eager = compare_backends(scene, "decode")
    backend.init_cuda_graph(8)
    static = dummy_decode_batch(backend.dummy_row, 8)
    bufs = graph_bufs(backend, static, 8)
    backend.prepare_for_capture(static, bufs)
    meta = static.attn_metadata
    assert meta.static and meta.rows.shape == (8,)
    assert meta.num_splits == backend.num_splits(8)
    refill(backend, bufs, batch)
    # the live requests longest first (90, 40, 5 cached tokens), then the padding rows
    assert meta.order.tolist() == [2, 1, 0, 3, 4, 5, 6, 7]
    q = torch.cat([qkv[0], torch.randn(5, *qkv[0].shape[1:], device=qkv[0].device)])
    out = backend.forward(q, None, None, scene.spec, static)  # K/V: already in the pool
    if meta.num_splits == backend.num_splits(3):  # same launches: the same bits
        assert torch.equal(out[:3], eager)
    torch.testing.assert_close(out[:3], eager, atol=2e-5, rtol=2e-5)
    dummy_v = scene.pool.v_cache(0)[scene.page_table[backend.dummy_row, 0].long()]
    torch.testing.assert_close(out[3:], dummy_v.repeat_interleave(2, 0).expand(5, -1, -1))
    assert backend.supports_cuda_graph


def test_registry_and_auto():
    assert resolve_attention_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_attention_backend("auto", torch.device("cuda")) == "triton"
    assert resolve_attention_backend("fa,auto", torch.device("cuda")) == "fa,triton"
    scene = Scene([0], [4], 4, 2, 16, torch.float32)
    backend = create_attention_backend("triton", scene.pool, scene.page_table)
    assert isinstance(backend, TritonBackend)
    hybrid = create_attention_backend("torch,triton", scene.pool, scene.page_table)
    assert hybrid.supports_cuda_graph and isinstance(hybrid.decode, TritonBackend)
    with pytest.raises(ValueError, match="PREFILL,DECODE"):
        create_attention_backend("torch,triton,torch", scene.pool, scene.page_table)


def test_hybrid_matches_reference():
    compare_backends(Scene([0, 7], [20, 3], 4, 2, 64, torch.float32, seed=4), "prefill",
                     "triton,torch")
    compare_backends(Scene([9, 30], [1, 1], 4, 2, 64, torch.float32, seed=4), "decode",
                     "torch,triton")


def test_fa_without_flash_attention_says_what_to_install(monkeypatch):
    from minisgl.attention import fa_backend

    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)
    with pytest.raises(ImportError, match="pip install flash-attn"):
        fa_backend.find_varlen()


def test_fa_falls_back_to_triton_for_float32_and_prefixes():
    pytest.importorskip("torch.nn.attention.varlen")
    scene = Scene([0, 6], [10, 4], 4, 2, 64, torch.float32, seed=5)
    compare_backends(scene, "prefill", name="fa")


# -- GPU: real sizes, bf16, CUDA graphs, engine parity -----------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads", [(16, 8), (32, 8), (32, 32)])
def test_gpu_backend_real_sizes(dtype, heads):
    hq, hkv = heads
    cached = [0, 1000, 3000, 0, 17, 4095]
    extend = [512, 300, 1, 1, 800, 1]
    scene = Scene(cached, extend, hq, hkv, 128, dtype, page_size=16, seed=hq)
    compare_backends(scene, "prefill")
    for r in scene.reqs:
        r.cached_len = r.device_len - 1
    compare_backends(scene, "decode")


@pytest.mark.gpu
@pytest.mark.parametrize("decode_kernel", [True, False])
def test_gpu_backend_mixed_real_sizes(decode_kernel):
    cached = [1000, 3000, 17, 4095, 0, 200]
    extend = [1, 1, 1, 1, 512, 300]
    scene = Scene(cached, extend, 32, 8, 128, torch.bfloat16, page_size=16, seed=9)
    batch, qkv = scene.batch("mixed")
    batch.num_decode = 4
    backend = TritonBackend(scene.pool, scene.page_table)
    backend.mixed_decode_kernel = decode_kernel
    out = scene.run(backend, batch, qkv)
    ref = scene.run(TorchBackend(scene.pool, scene.page_table), batch, qkv)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_fa_prefill_bf16():
    from minisgl.attention.fa_backend import find_varlen

    try:
        find_varlen()
    except ImportError as exc:
        pytest.skip(str(exc))
    scene = Scene([0, 0, 0], [1000, 1, 333], 32, 8, 128, torch.bfloat16, seed=6)
    backend, *_ = compare_backends(scene, "prefill", name="fa")
    print("fa backend uses", backend.impl)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_matches_eager():
    scene = Scene([100, 2000, 7], [1, 1, 1], 16, 8, 128, torch.bfloat16, seed=7)
    backend, batch, qkv, eager = compare_backends(scene, "decode")
    backend.init_cuda_graph(4)
    static = dummy_decode_batch(backend.dummy_row, 4)
    bufs = graph_bufs(backend, static, 4)
    backend.prepare_for_capture(static, bufs)
    q_static = torch.zeros(4, 16, 128, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # warm-up: compile, allocate workspace
        backend.forward(q_static, None, None, scene.spec, static)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out_static = backend.forward(q_static, None, None, scene.spec, static)
    torch.cuda.current_stream().wait_stream(stream)
    q_static[:3].copy_(qkv[0])
    refill(backend, bufs, batch)
    graph.replay()
    # eager ran num_splits(3), the graph num_splits(4): the same sums in another order
    torch.testing.assert_close(out_static[:3], eager, atol=1e-2, rtol=1e-2)
    for r in scene.reqs:  # longer contexts, same graph
        r.cached_len, r.device_len = r.device_len, r.device_len + 1
        scene.page_table[r.table_idx, r.device_len - 1] = r.table_idx
    batch2, (q2, _, _) = scene.batch("decode")
    backend.prepare_metadata(batch2)
    eager2 = backend.forward(q2, None, None, scene.spec, batch2)
    q_static[:3].copy_(q2)
    refill(backend, bufs, batch2)
    graph.replay()
    torch.testing.assert_close(out_static[:3], eager2, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_gpu_engine_parity_triton(tiny_checkpoints, graphs):
    """fp32 engine on --attn triton, every architecture: transformers' greedy tokens. With graphs:
    decode replays CUDA graphs (the backend's capture contract); chunked prefill hits prefixes."""
    from helpers.hf_models import ARCHS, hf_greedy, random_prompts
    from minisgl import LLM

    options = {"page_size": 4, "max_prefill_tokens": 13, "cuda_graph_max_bs": 8} if graphs else {
        "cuda_graph_max_bs": 0}
    prompts = random_prompts(4, [5, 17, 33, 60], 256, seed=0)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for arch in ARCHS:
        path = tiny_checkpoints[arch]
        llm = LLM(str(path), device="cuda", dtype="float32", attn="triton", num_pages=2048,
                  **options)
        outputs = llm.generate(prompts, greedy)
        assert [o.token_ids for o in outputs] == hf_greedy(path, prompts, 24), arch


@pytest.mark.skipif(DEV != "cpu", reason="the GPU test below covers every architecture compiled")
@pytest.mark.parametrize("pad", [1, 8])
@pytest.mark.slow
def test_engine_parity_interpreted(tiny_checkpoints, pad):
    """The whole engine with --attn triton under the interpreter: transformers' greedy tokens;
    with ``pad``, prefill and mixed forwards carry padding tokens up to a multiple of it (on CUDA:
    64)."""
    from helpers.hf_models import hf_greedy, random_prompts
    from minisgl import LLM

    path = tiny_checkpoints["qwen3"]
    prompts = random_prompts(3, [5, 17, 40], 256, seed=0)
    llm = LLM(str(path), device="cpu", dtype="float32", attn="triton", num_pages=512, page_size=4,
              max_prefill_tokens=16)  # chunked prefill: the extend kernel sees prefixes
    llm.scheduler.engine.pad_tokens = pad
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [o.token_ids for o in outputs] == hf_greedy(path, prompts, 8)
