"""The GEMV of batch-1 decode and verify steps (``kernel/triton/gemv.py``): 1 to 8 tokens against
``F.linear``, and every token's output bit for bit what the kernel gives for that token alone
(what makes a verify step's positions equal their plain decode steps, ``spec/rows.py``).

Without a GPU it runs under the Triton interpreter on fp32 data; on CUDA on bf16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton.gemv import gemv  # noqa: E402
from minisgl.kernel.triton.activation import silu_and_mul  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32
TOL = dict(atol=3e-2, rtol=3e-2) if DEV == "cuda" else dict(atol=1e-4, rtol=1e-4)


def _randn(*shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEV, DTYPE)


# (n, k, config): an uneven n and k (masked chunks), several chunks, the picked config
CASES = [(36, 200, (4, 64, 4)), (64, 256, (4, 64, 4)), (48, 96, None)]


@pytest.mark.parametrize("n, k, config", CASES)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_rows_match_f_linear_and_each_token_alone(n, k, config, gated, bias):
    w = _randn(n, k, seed=1)
    b = _randn(n, seed=2) if bias else None
    x = _randn(8, 2 * k if gated else k, seed=3)
    ref = F.linear((silu_and_mul(x) if gated else x).float(), w.float(),
                   None if b is None else b.float())
    alone = torch.cat([gemv(x[m : m + 1], w, b, gated, config) for m in range(8)])
    torch.testing.assert_close(alone.float(), ref, **TOL)
    for m in range(2, 9):  # ROWS 2, 4 and 8, and fewer tokens than ROWS
        assert torch.equal(gemv(x[:m], w, b, gated, config), alone[:m]), m


def test_more_tokens_than_it_takes_are_refused():
    w = _randn(8, 64, seed=1)
    with pytest.raises(AssertionError):
        gemv(_randn(9, 64, seed=2), w)
