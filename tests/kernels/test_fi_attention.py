"""The FlashInfer backend (``--attn fi``).

CPU, without flashinfer: the paged layout it plans from (``fi_plan.py``) against the Triton
backend's metadata of the same batches (page sizes 1 and 16: prefill, extend with a cached prefix,
decode, mixed), and the backend's plumbing (page ids, plan arguments, CUDA-graph buffers,
padding rows, windows, soft-caps, FP8 scales) through a torch stand-in of flashinfer's wrappers
(``helpers/fake_flashinfer.py``) against the torch reference backend. GPU (``gpu``, skipped
without flashinfer): the real kernels against the torch backend, under CUDA graphs, and greedy
parity with transformers through the engine.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from helpers import fake_flashinfer
from helpers.paged_scene import PagedScene
from minisgl.attention import create_attention_backend
from minisgl.attention.fa_backend import HybridBackend
from minisgl.attention.fi_backend import FlashInferBackend, check_usable, import_flashinfer
from minisgl.attention.fi_plan import gather_page_ids, paged_layout, write_pending_slots
from minisgl.attention.torch_backend import TorchBackend
from minisgl.core import Batch, Feed, Req, SamplingParams
from minisgl.engine.graph import dummy_decode_batch
from minisgl.kvcache.spec import AttentionSpec

HAS_FI = importlib.util.find_spec("flashinfer") is not None
needs_fi = pytest.mark.skipif(not HAS_FI, reason="flashinfer is not installed "
                              "(pip install -e '.[flashinfer]')")

# (cached, extend) per request of each phase; decode rows come first in a mixed batch
PHASES = {
    "prefill": ([0, 8, 16, 4, 0], [12, 1, 9, 30, 40], 0),
    "decode": ([0, 8, 16, 70, 3, 31], [1] * 6, 0),
    "mixed": ([8, 70, 3, 0, 16, 33], [1, 1, 1, 12, 9, 20], 3),
}


class Scene(PagedScene):
    """``PagedScene`` whose first ``num_decode`` requests are a mixed step's decode rows."""

    def __init__(self, cached, extend, hq, hkv, dim, dtype, page_size, seed=0, device="cpu",
                 num_decode=0, spare_pages=0):
        super().__init__(cached, extend, hq, hkv, dim, dtype, page_size, seed, device,
                         spare_pages)
        self.num_decode = num_decode

    def grow(self) -> None:
        """Every request decodes one more token: its next slot, on a fresh page when the last
        one is full."""
        for r in self.reqs:
            r.cached_len, r.device_len = r.device_len, r.device_len + 1
            pos = r.device_len - 1
            if pos % self.page_size == 0:
                slot = self.free.pop() * self.page_size
            else:
                slot = int(self.page_table[r.table_idx, pos - 1]) + 1
            self.page_table[r.table_idx, pos] = slot

    @classmethod
    def of(cls, phase, page_size, dtype=torch.float32, hq=8, hkv=2, dim=64, seed=1,
           device="cpu"):
        cached, extend, num_decode = PHASES[phase]
        return cls(cached, extend, hq, hkv, dim, dtype, page_size, seed, device, num_decode)

    def batch(self, pad: int = 0) -> tuple[Batch, tuple[torch.Tensor, ...]]:
        phase = "decode" if all(r.extend_len == 1 for r in self.reqs) and not self.num_decode \
            else "mixed" if self.num_decode else "prefill"
        batch = Batch([Feed.of(r) for r in self.reqs], phase, num_decode=self.num_decode)
        rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in self.reqs])
        pos = torch.cat([torch.arange(r.cached_len, r.device_len) for r in self.reqs])
        dev = self.page_table.device
        batch.out_loc = self.page_table[rows.to(dev), pos.to(dev)]
        n = len(rows)
        qkv = [torch.randn(n + pad, h, self.dim, generator=self.gen).to(self.dtype).to(dev)
               for h in (self.hq, self.hkv, self.hkv)]
        return batch, tuple(qkv)

    def spec(self, layer: int | AttentionSpec = 0) -> AttentionSpec:
        """Layer ``layer`` of the scene's heads (a spec passes through)."""
        if isinstance(layer, AttentionSpec):
            return layer
        return AttentionSpec(layer, self.hq, self.hkv, self.dim, self.dim**-0.5)

    def run(self, backend, batch, qkv, layer=0):
        backend.prepare_metadata(batch)
        n = batch.out_loc.shape[0]
        self.pool.store_kv(qkv[1][:n], qkv[2][:n], batch.out_loc, 0)
        return backend.forward(*qkv, self.spec(layer), batch)

    def reference(self, batch, qkv, layer=0):
        n = batch.out_loc.shape[0]
        torch_backend = TorchBackend(self.pool, self.page_table)
        return self.run(torch_backend, batch, tuple(x[:n] for x in qkv), layer)


def fake_backend(scene: Scene) -> FlashInferBackend:
    return FlashInferBackend(scene.pool, scene.page_table, fake_flashinfer)


def slots_of(layout, ids: torch.Tensor, page_size: int) -> list[list[int]]:
    """Each request's context slots, read back from a FlashInfer layout."""
    out = []
    for b in range(layout.size):
        pages = ids[layout.kv_indptr[b] : layout.kv_indptr[b + 1]].long().cpu()
        n = (len(pages) - 1) * page_size + layout.last_page_len[b]
        out.append((pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n].tolist())
    return out


# -- the layout, against the Triton backend's metadata ------------------------------------------


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("page_size", [1, 16])
def test_layout_matches_triton_metadata(phase, page_size):
    """Same batch, same page table: FlashInfer's indptrs, page ids and last-page lengths
    describe exactly the rows, context lengths, token offsets and slots of Triton's metadata."""
    pytest.importorskip("triton")
    from minisgl.attention.triton_backend import TritonBackend, TritonMixedMetadata

    scene = Scene.of(phase, page_size)
    batch, _ = scene.batch()
    triton = TritonBackend(scene.pool, scene.page_table)
    triton.prepare_metadata(batch)
    meta = batch.attn_metadata
    parts = [meta.decode, meta.prefill] if isinstance(meta, TritonMixedMetadata) else [meta]
    rows = sum((p.rows.tolist() for p in parts), [])
    seq_lens = sum((p.seq_lens.tolist() for p in parts), [])
    layout = paged_layout(batch.feeds, page_size)
    ids = gather_page_ids(scene.page_table, layout, page_size)
    assert layout.rows == rows
    assert layout.num_pages == len(ids) == sum(-(-n // page_size) for n in seq_lens)
    assert all(1 <= n <= page_size for n in layout.last_page_len)
    for b, slots in enumerate(slots_of(layout, ids, page_size)):
        assert slots == scene.page_table[rows[b], : seq_lens[b]].tolist()
    extends = [r.extend_len for r in scene.reqs]
    assert layout.qo_indptr == [sum(extends[:i]) for i in range(len(extends) + 1)]
    if not batch.is_decode:  # Triton's prefill part: the same offsets from its own first token
        cu = meta.prefill.cu_seqlens.tolist() if isinstance(meta, TritonMixedMetadata) \
            else meta.cu_seqlens.tolist()
        start = layout.qo_indptr[len(layout.qo_indptr) - len(cu)]
        assert [x - start for x in layout.qo_indptr[-len(cu):]] == cu


def test_layout_by_hand():
    """Two requests over pages of 4: 6 tokens (2 pages, 2 in the last) with 2 new, 4 tokens (1
    full page) all new; padded with the dummy request to 3."""
    table = torch.zeros(4, 8, dtype=torch.int32)
    table[2, :6] = torch.tensor([20, 21, 22, 23, 8, 9])  # pages 5, 2
    table[0, :4] = torch.tensor([28, 29, 30, 31])  # page 7
    feeds = [Feed(Req(uid=0, input_ids=[1] * 7, prompt_len=7, sampling_params=SamplingParams(),
                      max_device_len=8, table_idx=2, cached_len=4, device_len=6), 4, 6),
             Feed(Req(uid=1, input_ids=[1] * 5, prompt_len=5, sampling_params=SamplingParams(),
                      max_device_len=8, table_idx=0, cached_len=0, device_len=4), 0, 4)]
    layout = paged_layout(feeds, 4, pad_to=3, dummy_row=3)
    assert layout.qo_indptr == [0, 2, 6, 7]
    assert layout.kv_indptr == [0, 2, 3, 4]
    assert layout.last_page_len == [2, 4, 1]
    assert layout.rows == [2, 0, 3]
    assert gather_page_ids(table, layout, 4).tolist() == [5, 2, 7, 0]
    qo, kv, last = layout.host_tensors(pin=False)
    assert [qo.tolist(), kv.tolist(), last.tolist()] == [[0, 2, 6, 7], [0, 2, 3, 4], [2, 4, 1]]
    assert qo.dtype == kv.dtype == last.dtype == torch.int32


def test_pending_slots_are_written_before_the_gather():
    """A replayed decode step's new slots reach the page table only inside the graph: the
    gather must see them (a new page each for page size 1)."""
    scene = Scene.of("decode", 1)
    batch, _ = scene.batch()
    truth = scene.page_table.clone()
    slots = [int(scene.page_table[f.table_idx, f.device_len - 1]) for f in batch.feeds]
    for f in batch.feeds:
        scene.page_table[f.table_idx, f.device_len - 1] = 0  # not flushed
    slots[1] = -1  # already in the table
    scene.page_table[batch.feeds[1].table_idx] = truth[batch.feeds[1].table_idx]
    write_pending_slots(scene.page_table, batch.feeds, slots)
    assert torch.equal(scene.page_table, truth)
    write_pending_slots(scene.page_table, batch.feeds, None)  # eager: nothing pending


# -- the backend through the stand-in wrappers --------------------------------------------------


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("page_size", [1, 16])
def test_backend_matches_reference(phase, page_size):
    scene = Scene.of(phase, page_size, seed=3)
    batch, qkv = scene.batch()
    ref = scene.reference(batch, qkv)
    backend = fake_backend(scene)
    out = scene.run(backend, batch, qkv)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    wrappers = backend._decode if phase == "decode" else backend._prefill
    assert len(wrappers) == 1
    wrapper = next(iter(wrappers.values()))
    assert wrapper.plans == 1 and wrapper.use_cuda_graph is False
    assert wrapper.causal is (phase != "decode") and wrapper.window_left == -1
    for _ in range(3):  # every other layer of the step runs on the same plan
        backend.forward(*qkv, scene.spec(), batch)
    assert wrapper.plans == 1


def test_padding_rows_are_zeros():
    """A prefill padded with rows no request covers (piecewise graphs, eager padding): run sees
    only the planned rows; the live rows match the reference, the padding rows are zeros (not
    what the buffer held: stale memory may be NaN, which a MoE router would read)."""
    scene = Scene.of("mixed", 16, seed=4)
    batch, qkv = scene.batch(pad=5)
    out = torch.full_like(qkv[0], 7.0)
    backend = fake_backend(scene)
    backend.prepare_metadata(batch)
    n = batch.out_loc.shape[0]
    scene.pool.store_kv(qkv[1][:n], qkv[2][:n], batch.out_loc, 0)
    assert backend.forward(*qkv, scene.spec(), batch, out=out) is out
    torch.testing.assert_close(out[:n], scene.reference(batch, qkv), atol=1e-4, rtol=1e-4)
    assert bool((out[n:] == 0.0).all())


@pytest.mark.parametrize("page_size", [1, 16])
def test_layer_kinds_window_and_softcap(page_size):
    """Layers of two kinds (a sliding window with a soft-cap, and plain): one plan each, with
    FlashInfer's window_left (the window minus the query's own key)."""
    scene = Scene.of("prefill", page_size, seed=5)
    batch, qkv = scene.batch()
    scale = scene.dim**-0.5
    local = AttentionSpec(0, 8, 2, 64, scale, sliding_window=5, logit_softcap=3.0)
    plain = AttentionSpec(0, 8, 2, 64, scale)
    refs = {spec: scene.reference(batch, qkv, spec) for spec in (local, plain)}
    backend = fake_backend(scene)
    backend.check_layers([local, plain])
    backend.prepare_metadata(batch)
    for spec in (local, plain, local):
        out = backend.forward(*qkv, spec, batch)
        torch.testing.assert_close(out, refs[spec], atol=1e-4, rtol=1e-4)
    planned = batch.attn_metadata.planned
    assert len(planned) == 2 and planned[backend.kind(local)].window_left == 4
    assert planned[backend.kind(local)].softcap == 3.0


def test_fp8_kv_scales():
    """FP8 K/V: the pool's per-layer scales reach run (k into the scores, v onto the output)."""
    scene = Scene.of("mixed", 16, dtype=torch.float8_e4m3fn, seed=6)
    scene.pool.set_kv_scales(0, 0.5, 2.0)
    batch, _ = scene.batch()
    n = batch.out_loc.shape[0]
    qkv = tuple(torch.randn(n, h, scene.dim, generator=scene.gen)
                for h in (scene.hq, scene.hkv, scene.hkv))
    out = scene.run(fake_backend(scene), batch, qkv)
    torch.testing.assert_close(out, scene.reference(batch, qkv), atol=1e-3, rtol=1e-3)


def test_cuda_graph_protocol():
    """Capture plans the graph wrapper of a size over the static buffers; plan_replay re-plans
    it for a live batch (its newest slots not yet in the page table), and the captured run reads
    the refilled buffers: the live rows match the reference, the padding rows the dummy."""
    scene = Scene.of("decode", 1, hq=8, hkv=2, seed=7)
    batch, qkv = scene.batch()
    ref = scene.reference(batch, qkv)
    backend = fake_backend(scene)
    backend.init_cuda_graph(8)
    static = dummy_decode_batch(backend.dummy_row, 8)
    backend.prepare_for_capture(static, torch.zeros(0, 8, dtype=torch.int32))
    assert backend.replay_metadata(static, 8) == []
    q_static = torch.zeros(8, scene.hq, scene.dim)
    backend.forward(q_static, None, None, scene.spec(), static)  # the warm-up: plans
    kind = backend.kind(scene.spec())
    assert kind == (8, 2, 64, scene.dim**-0.5, None, None, False)
    wrapper = static.attn_metadata.planned[kind]
    assert wrapper.use_cuda_graph and wrapper.plans == 1
    batch.out_slots = [int(scene.page_table[f.table_idx, f.device_len - 1]) for f in batch.feeds]
    for f in batch.feeds:  # the graph writes these itself, after the plan
        scene.page_table[f.table_idx, f.device_len - 1] = 0
    backend.plan_replay(batch, 8)
    assert wrapper.plans == 2 and backend._graph[8] == {kind: wrapper}
    q_static[: batch.size] = qkv[0]
    out = backend.forward(q_static, None, None, scene.spec(), static)  # what the replay runs
    assert wrapper.plans == 2
    torch.testing.assert_close(out[: batch.size], ref, atol=1e-4, rtol=1e-4)
    dummy_v = scene.pool.v_cache(0)[0]  # page 0, slot 0: the scratch the dummy attends to
    pad = 8 - batch.size
    torch.testing.assert_close(out[batch.size:],
                               dummy_v.repeat_interleave(4, 0).expand(pad, -1, -1))


def test_hybrid_pairs_with_fi():
    """``fi,torch``: prefill and mixed steps on FlashInfer (padding rows allowed, so piecewise
    graphs may run), decode on the other backend; ``torch,fi`` the other way round."""
    scene = Scene.of("mixed", 16, seed=8)
    torch_backend = TorchBackend(scene.pool, scene.page_table)
    pair = HybridBackend(fake_backend(scene), torch_backend)
    assert pair.supports_padding and not pair.supports_cuda_graph
    batch, qkv = scene.batch()
    ref = scene.reference(batch, qkv)
    torch.testing.assert_close(scene.run(pair, batch, qkv), ref, atol=1e-4, rtol=1e-4)
    assert type(batch.attn_metadata).__name__ == "FlashInferMetadata"
    other = HybridBackend(torch_backend, fake_backend(scene))
    assert other.supports_cuda_graph and not other.supports_padding


# -- what it refuses, and what it says ------------------------------------------------------------


def test_sinks_are_refused_naming_the_family():
    scene = Scene.of("prefill", 1)
    spec = AttentionSpec(3, 8, 2, 64, 0.125, sinks=torch.zeros(8))
    with pytest.raises(ValueError, match="does not compute attention sinks.*gpt-oss.*triton"):
        fake_backend(scene).check_layers([AttentionSpec(0, 8, 2, 64, 0.125), spec])


def test_cpu_and_float32_are_refused():
    scene = Scene.of("prefill", 1)
    with pytest.raises(ValueError, match="runs on CUDA only"):
        create_attention_backend("fi", scene.pool, scene.page_table)

    class Table:  # a CUDA page table, as far as the check looks
        device = torch.device("cuda")

    with pytest.raises(ValueError, match="not float32"):
        check_usable(scene.pool, Table())  # type: ignore[arg-type]


def test_missing_flashinfer_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[flashinfer\]'"):
        import_flashinfer()


def test_attn_names():
    from minisgl.server.launch.args import parse_args

    assert parse_args(["--attn", "fi"]).engine.attn == "fi"
    assert parse_args(["--attn", "fi,triton"]).engine.attn == "fi,triton"
    assert parse_args(["--attn", "triton,fi"]).engine.attn == "triton,fi"
    assert parse_args(["--attention-backend", "flashinfer"]).engine.attn == "fi"
    assert parse_args(["--attention-backend", "FLASHINFER"]).engine.attn == "fi"
    with pytest.raises(ValueError, match="only on Blackwell GPUs.*use --attn fi or --attn triton"):
        parse_args(["--attn", "trtllm"])
    with pytest.raises(ValueError, match="only on Blackwell"):
        parse_args(["--attn", "fi,trtllm"])
    with pytest.raises(ValueError, match="PREFILL,DECODE"):
        parse_args(["--attn", "fi,triton,torch"])


def test_sglang_trtllm_spelling_says_why(capsys):
    from minisgl.server.launch.args import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--attention-backend", "trtllm_mha"])
    assert "only on Blackwell GPUs" in capsys.readouterr().err


# -- GPU: FlashInfer's kernels -------------------------------------------------------------------


def gpu_scene(phase, page_size, dtype=torch.bfloat16, hq=32, hkv=8, seed=0):
    cached, extend, num_decode = {
        "prefill": ([0, 0, 0], [1000, 1, 333], 0),
        "extend": ([0, 1000, 3000, 17, 4095], [512, 300, 64, 800, 1], 0),
        "decode": ([1000, 3000, 17, 4095, 0, 200], [1] * 6, 0),
        "mixed": ([1000, 3000, 17, 4095, 0, 200], [1, 1, 1, 1, 512, 300], 4),
    }[phase]
    return Scene(cached, extend, hq, hkv, 128, dtype, page_size, seed, "cuda", num_decode,
                 spare_pages=64)


@pytest.mark.gpu
@needs_fi
@pytest.mark.parametrize("phase", ["prefill", "extend", "decode", "mixed"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_gpu_fi_matches_torch(phase, page_size):
    """Qwen3-8B's heads (32, 8 KV, 128): the kernels the benchmark uses (each variant of head
    size, dtype, GQA group or mask is a JIT compile of its own on a cold cache)."""
    scene = gpu_scene(phase, page_size, seed=page_size)
    batch, qkv = scene.batch(pad=7 if phase != "decode" else 0)
    backend = create_attention_backend("fi", scene.pool, scene.page_table)
    out = scene.run(backend, batch, qkv)
    n = batch.out_loc.shape[0]
    torch.testing.assert_close(out[:n].float(), scene.reference(batch, qkv).float(),
                               atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_fi
@pytest.mark.parametrize("page_size", [1, 16])
def test_gpu_fi_window_softcap_and_fp8(page_size):
    scene = gpu_scene("extend", page_size, seed=3)
    batch, qkv = scene.batch()
    spec = AttentionSpec(0, 32, 8, 128, scene.dim**-0.5, sliding_window=700, logit_softcap=20.0)
    backend = create_attention_backend("fi", scene.pool, scene.page_table)
    out = scene.run(backend, batch, qkv, spec)
    torch.testing.assert_close(out.float(), scene.reference(batch, qkv, spec).float(),
                               atol=2e-2, rtol=2e-2)
    fp8 = gpu_scene("mixed", page_size, dtype=torch.float8_e4m3fn, seed=4)
    fp8.pool.set_kv_scales(0, 0.5, 2.0)
    batch, _ = fp8.batch()
    n = batch.out_loc.shape[0]
    qkv = tuple(torch.randn(n, h, 128, device="cuda", dtype=torch.bfloat16)
                for h in (32, 8, 8))
    backend = create_attention_backend("fi", fp8.pool, fp8.page_table)
    torch.testing.assert_close(fp8.run(backend, batch, qkv).float(),
                               fp8.reference(batch, qkv).float(), atol=3e-2, rtol=3e-2)


@pytest.mark.gpu
@needs_fi
@pytest.mark.parametrize("page_size", [1, 16])
def test_gpu_fi_cuda_graph_replay(page_size):
    """A decode step captured on the dummy batch, replayed for live batches of growing contexts
    (their newest slots handed over as the scheduler does): eager results."""
    scene = gpu_scene("decode", page_size, seed=5)
    backend = create_attention_backend("fi", scene.pool, scene.page_table)
    backend.init_cuda_graph(8)
    static = dummy_decode_batch(backend.dummy_row, 8)
    backend.prepare_for_capture(static, torch.zeros(0, 8, dtype=torch.int32, device="cuda"))
    q_static = torch.zeros(8, 32, 128, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.forward(q_static, None, None, scene.spec(), static)  # warm-up: JIT, plan
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out_static = backend.forward(q_static, None, None, scene.spec(), static)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        batch, qkv = scene.batch()
        eager = scene.reference(batch, qkv)
        batch.out_slots = [int(scene.page_table[f.table_idx, f.device_len - 1])
                           for f in batch.feeds]
        for f in batch.feeds:
            scene.page_table[f.table_idx, f.device_len - 1] = 0
        q_static[: batch.size].copy_(qkv[0])
        backend.plan_replay(batch, 8)
        graph.replay()
        torch.testing.assert_close(out_static[: batch.size].float(), eager.float(),
                                   atol=2e-2, rtol=2e-2)
        scene.grow()


@pytest.mark.gpu
@needs_fi
@pytest.mark.parametrize("page_size", [1, 16])
def test_gpu_engine_greedy_parity_fi(tmp_path, page_size):
    """--attn fi through the engine in bf16 (chunked prefill hits prefixes; decode under CUDA
    graphs, prefill under piecewise graphs): transformers' fp32 greedy tokens, up to a near-tie
    of transformers' own logits, where bf16 (~1% of the logits' spread) may pick the other one.
    Head size 128 and a GQA group of 4, as Qwen3-8B: the kernels the benchmark compiles too."""
    from helpers.hf_models import (
        hf_greedy,
        hf_prefill_logits,
        make_tiny_checkpoint,
        random_prompts,
    )
    from minisgl import LLM

    prompts = random_prompts(4, [5, 17, 33, 60], 256, seed=0)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for arch in ("llama", "qwen3"):
        path = make_tiny_checkpoint(arch, tmp_path / arch, num_kv_heads=1, head_dim=128)
        expected = hf_greedy(path, prompts, 24)
        llm = LLM(str(path), device="cuda", dtype="bfloat16", attn="fi", num_pages=2048,
                  page_size=page_size, max_prefill_tokens=13, cuda_graph_max_bs=8)
        got = [o.token_ids for o in llm.generate(prompts, greedy)]
        for prompt, ours, theirs in zip(prompts, got, expected):
            if ours == theirs:
                continue
            i = next(j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b)
            step = hf_prefill_logits(path, [list(prompt) + theirs[:i]])[0][-1]
            top2 = step.topk(2).values
            gap = float(top2[0] - top2[1])
            assert gap < 0.03 * float(step.std()), (arch, i, gap, ours, theirs)
