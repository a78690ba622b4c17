"""The decode graph's own kernels (``kernel/triton/decode_step.py``) and the page table's update
(``kernel/triton/scatter.py``) against torch's indexing: the greedy sampler gives ``torch.argmax``
(the first index of each row's maximum), written to ``out`` and to the token pool at the row's
(row, position), and nothing at all when the flag is 0. Interpreted on CPU, compiled on a GPU."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

import_triton()

from minisgl.kernel.triton.decode_step import gather_inputs, greedy_to_pool  # noqa: E402
from minisgl.kernel.triton.scatter import scatter_2d_  # noqa: E402

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def logits_with_ties(b: int, v: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Coarse values (many equal maxima in a row, in different splits); row 0 all -inf when b > 2,
    the last row's maximum in its last column."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-8, 8, (b, v), generator=g).to(dtype)
    if b > 2:
        x[0] = float("-inf")
    x[-1, -1] = 100
    return x.to(DEV)


def run(logits: torch.Tensor, flag: int, splits: int | None = None, block: int = 32):
    b = logits.shape[0]
    pool = torch.full((b + 3, 2 * b + 2), -1, dtype=torch.int32, device=DEV)
    rows = torch.randperm(b + 3, generator=torch.Generator().manual_seed(b))[:b].to(DEV)
    positions = torch.arange(b, device=DEV) * 2 + 1
    out = torch.full((b,), -1, dtype=torch.int64, device=DEV)
    greedy_to_pool(logits, torch.tensor([flag], device=DEV), rows, positions, pool, out,
                   splits=splits, block=block)
    return out, pool, rows, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b, v, splits", [(1, 1000, None), (3, 517, None), (3, 517, 1),
                                          (5, 300, 4), (40, 130, None)])
def test_argmax_written_to_out_and_pool(dtype, b, v, splits):
    logits = logits_with_ties(b, v, dtype, seed=b + v)
    out, pool, rows, positions = run(logits, 1, splits)
    expected = logits.argmax(dim=-1)
    assert torch.equal(out, expected)
    assert torch.equal(pool[rows, positions], expected.to(torch.int32))
    pool[rows, positions] = -1
    assert (pool == -1).all(), "written elsewhere than the rows' positions"


def test_flag_zero_writes_nothing():
    out, pool, _, _ = run(logits_with_ties(3, 200, torch.float32, seed=1), 0)
    assert (out == -1).all() and (pool == -1).all()


@pytest.mark.parametrize("bs", [1, 5, 300])
def test_gather_inputs_reads_tokens_and_writes_given_slots(bs):
    """Tokens as torch's indexing reads them; a given slot lands in the page table and is the
    step's slot, -1 reads the table's. Distinct (row, position) pairs, as a decode step's are."""
    g = torch.Generator().manual_seed(bs)
    pool = torch.randint(0, 50000, (bs + 2, 40), generator=g, dtype=torch.int32).to(DEV)
    table = torch.randint(0, 10**6, (bs + 2, 40), generator=g, dtype=torch.int32).to(DEV)
    cells = torch.randperm((bs + 2) * 40, generator=g)[:bs]
    rows, positions = (cells // 40).to(torch.int32), (cells % 40).to(torch.int32)
    slots = torch.randint(0, 10**6, (bs,), generator=g, dtype=torch.int32)
    slots[::2] = -1
    expected_table = table.clone()
    given = slots >= 0
    expected_table[rows[given].long(), positions[given].long()] = slots[given].to(DEV)
    rows, positions, slots = rows.to(DEV), positions.to(DEV), slots.to(DEV)
    ids, pos, loc, rope = gather_inputs(rows, positions, slots, pool, table)
    assert torch.equal(ids, pool[rows.long(), positions.long()]) and ids.dtype == torch.int32
    assert torch.equal(pos, positions.long()) and pos.dtype == torch.int64 and rope is pos
    assert torch.equal(table, expected_table)
    assert torch.equal(loc, table[rows.long(), positions.long()]) and loc.dtype == torch.int32


def test_gather_inputs_shifts_the_rotary_positions():
    """M-RoPE deltas (negative after a large image) shift the rotary positions only: the token
    and the slot are read at the index."""
    pool = torch.arange(4 * 50, dtype=torch.int32, device=DEV).view(4, 50)
    table = torch.arange(4 * 50, dtype=torch.int32, device=DEV).view(4, 50) + 1000
    rows = torch.tensor([2, 0, 3], dtype=torch.int32, device=DEV)
    positions = torch.tensor([40, 7, 0], dtype=torch.int32, device=DEV)
    shifts = torch.tensor([-30, 0, 5], dtype=torch.int32, device=DEV)
    slots = torch.full((3,), -1, dtype=torch.int32, device=DEV)
    ids, pos, loc, rope = gather_inputs(rows, positions, slots, pool, table, shifts)
    assert ids.tolist() == [140, 7, 150] and pos.tolist() == [40, 7, 0]
    assert loc.tolist() == [1140, 1007, 1150]
    assert rope.tolist() == [10, 7, 5] and rope.dtype == torch.int64


@pytest.mark.parametrize("n", [0, 1, 7, 2000])
def test_scatter_writes_the_pairs_and_nothing_else(n):
    g = torch.Generator().manual_seed(n)
    table = torch.randint(0, 100, (64, 80), generator=g, dtype=torch.int32).to(DEV)
    cells = torch.randperm(64 * 80, generator=g)[:n]  # distinct (row, column) pairs
    values = torch.randint(0, 10**6, (n,), generator=g, dtype=torch.int32)
    updates = torch.stack([cells // 80, cells % 80, values]).to(torch.int32).to(DEV)
    expected = table.clone()
    expected[updates[0].long(), updates[1].long()] = updates[2]
    scatter_2d_(table, updates)
    assert torch.equal(table, expected)


@pytest.mark.parametrize("page_size", [1, 4])
def test_flush_leaves_the_graph_its_new_tokens(page_size):
    """``CacheCoordinator.flush(new_tokens_of=...)`` (a decode batch replaying a CUDA graph): the
    new tokens' slots come back for the graph to write; every other change reaches the device table,
    and together they make it equal the host's."""
    from minisgl.core import Req, SamplingParams
    from minisgl.kvcache import create_prefix_cache
    from minisgl.scheduler.cache import CacheCoordinator
    from minisgl.scheduler.full_attention import FullAttentionManager

    device_table = torch.zeros(5, 32, dtype=torch.int32, device=DEV)
    full = FullAttentionManager(64, page_size, device_table,
                                create_prefix_cache("naive", page_size, "cpu"))
    if DEV == "cpu":  # a separate device table, as on a GPU
        full.pages.host_table = torch.zeros_like(device_table)
    cache = CacheCoordinator(full)
    reqs = [Req(uid=i, input_ids=[1] * 5, prompt_len=4, sampling_params=SamplingParams(),
                max_device_len=30, table_idx=i, device_len=0) for i in range(3)]
    cache.allocate_many(reqs, [4, 4, 4])  # the prompts (whole pages): flushed as any change
    assert cache.flush() is None
    for req in reqs:
        req.device_len = 4
    cache.allocate_many(reqs, [5, 5, 5])  # a decode step: a new page each
    for req in reqs:
        req.device_len = 5
    slots = cache.flush(new_tokens_of=reqs)
    assert slots == [int(full.pages.host_table[r.table_idx, 4]) for r in reqs]
    written = device_table.cpu().clone()
    assert (written[:3, 4] == 0).all(), "the new tokens' entries are the graph's to write"
    written[:3, 4] = torch.tensor(slots, dtype=torch.int32)
    assert torch.equal(written, full.pages.host_table)  # the rest of a new page arrived
