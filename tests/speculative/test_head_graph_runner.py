"""The draft head's chain-step graphs (``engine/head_graph.py``) on CPU, where nothing is captured:
the sizes captured, the static rows a step sends against the eager step's batch, no graphs on
CPU, and the runner's whole replay path driven by a stand-in for the graphs (each replay runs the
captured step again over the static buffers, with an attention backend that reads its metadata
from the static rows when it runs, as a replayed kernel does): the drafts are the eager chain's.
The GPU side (real graphs, Triton and FlashInfer): ``test_spec_head_graphs.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers.eagle3_drafts import VOCAB, eagle3_spec, make_checkpoints
from helpers.hf_models import random_prompts
from helpers.spec_spy import spy_on_proposer
from minisgl import LLM, SamplingParams
from minisgl.attention.base import BaseAttnMetadata
from minisgl.attention.torch_backend import TorchBackend
from minisgl.core import Batch, Feed, Req
from minisgl.engine.head_graph import HeadGraphRunner, chain_sizes, locate
from minisgl.speculative.decoder import SpecDecoder
from minisgl.speculative.eagle3 import Eagle3Proposer
from minisgl.speculative.head import HeadProposer
from minisgl.speculative.head_batch import head_batch, lent_slots


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return make_checkpoints(tmp_path_factory.mktemp("eagle3"), names=("llama",))["llama"]


def make_llm(checkpoints) -> LLM:
    target, draft = checkpoints
    return LLM(str(target), device="cpu", dtype="float32", num_pages=4096,
               speculative_config=eagle3_spec(draft, k=4))


def spec_of(llm: LLM) -> tuple[SpecDecoder, HeadProposer]:
    spec = llm.scheduler.spec
    assert spec is not None and isinstance(spec.proposer, HeadProposer)
    return spec, spec.proposer


def test_chain_sizes_stop_at_the_first_that_holds_the_rows():
    assert chain_sizes([1, 2, 4, 8, 16, 32], 16) == [1, 2, 4, 8, 16]
    assert chain_sizes([1, 2, 4, 8, 16], 3) == [1, 2, 4]
    assert chain_sizes([16, 32, 48], 4) == [16]  # --cuda-graph-bs without small sizes
    assert chain_sizes([2, 1, 4], 16) == [1, 2, 4]  # fewer than the rows: all, the rest eager


def request(uid: int, row: int, n: int) -> Req:
    return Req(uid=uid, input_ids=list(range(n)), prompt_len=n, sampling_params=SamplingParams(),
               max_device_len=n + 8, table_idx=row, cached_len=n - 1, device_len=n - 1)


def test_static_rows_give_the_eager_steps_positions_and_slots():
    """Every chained step of three requests (4, 3 and 2 drafts): the positions and K/V slots the
    graph gathers from its static rows are the eager batch's, the padding row writes slot 0 of
    the scratch page, and the backend's rows are the dummy request's past the real ones."""
    table = torch.zeros(5, 32, dtype=torch.int32)  # row 4: the dummy request
    reqs = [request(1, 0, 10), request(2, 2, 7), request(3, 1, 12)]
    for req in reqs:
        n = len(req.input_ids)
        table[req.table_idx, : n - 1] = torch.arange(100 * (req.uid), 100 * req.uid + n - 1)
    backend = SimpleNamespace(graph_metadata_rows=1,
                              replay_metadata=lambda batch, bs: [[7] * bs])
    ctx = SimpleNamespace(page_table=table, attn_backend=backend)
    runner = HeadGraphRunner(ctx, 8, torch.float32, [1, 2, 4], dummy_row=4)  # type: ignore[arg-type]
    lens = [4, 3, 2]
    slots = torch.arange(1000, 1016, dtype=torch.int32)
    with lent_slots(table, reqs, lens, slots) as scratch:
        for j in range(1, 4):
            m = sum(1 for k in lens if k > j)
            feeds = [Feed(r, len(r.input_ids) - 2 + j, len(r.input_ids) - 1 + j)
                     for r in reqs[:m]]
            eager = head_batch(feeds, "decode", table, scratch[:m, j - 1])
            bs = runner.padded(m)
            rows = runner.host_inputs(Batch(feeds, "decode"), bs)
            assert len(rows) == runner.rows and rows[2] == [7] * bs
            positions, out_loc = locate(table, torch.tensor(rows, dtype=torch.int32))
            assert eager.positions is not None and eager.out_loc is not None
            assert torch.equal(positions[:m], eager.positions)
            assert torch.equal(out_loc[:m], eager.out_loc)
            assert out_loc[m:].tolist() == [0] * (bs - m)  # the dummy row's slot: page 0's
    assert runner.padded(3) == 4 and runner.fits(4) and not runner.fits(5)


def test_no_graphs_on_cpu(checkpoints):
    llm = make_llm(checkpoints)
    engine, (_, proposer) = llm.scheduler.engine, spec_of(llm)
    assert engine.graph_runner is None and engine.head_graphs is None
    assert proposer.graphs is None
    llm.close()


class FromRows(BaseAttnMetadata):
    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows


class RowsTorchBackend(TorchBackend):
    """The torch backend behind the graph protocol (``attention/base.py``): a captured batch's
    metadata is read from its static rows (page-table rows, context lengths) at each forward."""

    supports_cuda_graph = True
    graph_metadata_rows = 2

    def prepare_for_capture(self, batch: Batch, bufs: torch.Tensor) -> None:
        batch.attn_metadata = FromRows(bufs)

    def replay_metadata(self, batch: Batch, padded_bs: int) -> list[list[int]]:
        pad = padded_bs - batch.size
        return [[f.table_idx for f in batch.feeds] + [self.page_table.shape[0] - 1] * pad,
                [f.device_len for f in batch.feeds] + [1] * pad]

    def forward(self, q, k, v, spec, batch, out=None):
        if isinstance(batch.attn_metadata, FromRows):
            rows, lens = batch.attn_metadata.rows.tolist()
            anyone = request(-1, 0, 2)
            batch = Batch([Feed(anyone, n - 1, n, table_idx=r) for r, n in zip(rows, lens)],
                          "decode")
            self.prepare_metadata(batch)
        return super().forward(q, k, v, spec, batch, out)


class Rerun:
    def __init__(self, fn) -> None:
        self.replay = fn

    def reset(self) -> None:
        pass


class RerunRunner(HeadGraphRunner):
    """Replays by running the captured step again, its outputs copied into the static ones."""

    def _capture_one(self, batch, step):
        bs = batch.size
        self.outputs[bs] = self._run(batch, step)
        return Rerun(lambda: [o.copy_(n) for o, n in zip(self.outputs[bs], self._run(batch, step))])


def drafts_of(checkpoints, graphs: bool) -> tuple[list, list, list[int]]:
    """Six requests' outputs and drafts (steps drafting for six, then fewer), with the
    replayed chain steps of sizes 2 and 4 (one row padded to 2, three to 4; five or six rows
    eager) or without; and the rows of every replayed step."""
    llm = make_llm(checkpoints)
    engine, (spec, proposer) = llm.scheduler.engine, spec_of(llm)
    replayed: list[int] = []
    if graphs:
        engine.ctx.attn_backend = RowsTorchBackend(engine.kv_pool, engine.page_table)
        assert isinstance(proposer, Eagle3Proposer)
        runner = RerunRunner(engine.ctx, proposer.head.cfg.hidden_size, torch.float32, [2, 4],
                             engine.dummy_row)
        runner.capture(proposer._step)
        engine.head_graphs = runner
        spec.reset()  # the new proposer replays the engine's graphs
        assert spec_of(llm)[1].graphs is runner
        replay = runner.replay

        def spy(feeds, tokens, hidden):
            replayed.append(len(feeds))
            return replay(feeds, tokens, hidden)

        runner.replay = spy
    _, calls = spy_on_proposer(spec_of(llm)[1])
    prompts = random_prompts(6, [40, 66, 54, 80, 30, 60], VOCAB, seed=8)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
              for n in (4, 6, 8, 10, 12, 14)]  # six, then fewer, requests draft together
    outs = llm.generate(prompts, params)
    llm.scheduler.check_integrity()
    llm.close()
    return [o.token_ids for o in outs], calls, replayed


def test_replayed_chain_steps_draft_what_eager_steps_draft(checkpoints):
    outs, calls, _ = drafts_of(checkpoints, graphs=False)
    graph_outs, graph_calls, replayed = drafts_of(checkpoints, graphs=True)
    assert graph_calls == calls and graph_outs == outs
    assert sum(1 for _, d in calls if d) > 20
    assert set(replayed) == {1, 2, 3, 4}  # 1 and 3 padded; 5 and 6 eager
