"""The decode graph's own kernels (``kernel/triton/decode_step.py``) and the page table's update
(``kernel/triton/scatter.py``) against torch's indexing: the greedy sampler gives ``torch.argmax``
(the first index of each row's maximum), written to ``out`` and to the token pool at the row's
(row, position), and nothing at all when the flag is 0. Interpreted on CPU, compiled on a GPU."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
pytest.importorskip("triton")

from minisgl.kernel.triton.decode_step import gather_inputs, greedy_to_pool  # noqa: E402
from minisgl.kernel.triton.scatter import scatter_2d_  # noqa: E402

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
def test_gather_inputs_is_torch_indexing(bs):
    g = torch.Generator().manual_seed(bs)
    pool = torch.randint(0, 50000, (bs + 2, 40), generator=g, dtype=torch.int32).to(DEV)
    table = torch.randint(0, 10**6, (bs + 2, 40), generator=g, dtype=torch.int32).to(DEV)
    rows = torch.randint(0, bs + 2, (bs,), generator=g)
    positions = torch.randint(0, 40, (bs,), generator=g)
    inputs = torch.stack([rows, positions, positions + 1]).to(torch.int32).to(DEV)
    ids, pos, loc = gather_inputs(inputs[:2], pool, table)
    rows, positions = rows.to(DEV), positions.to(DEV)
    assert torch.equal(ids, pool[rows, positions]) and ids.dtype == torch.int32
    assert torch.equal(pos, positions) and pos.dtype == torch.int64
    assert torch.equal(loc, table[rows, positions]) and loc.dtype == torch.int32


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
