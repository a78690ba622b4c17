"""The fused router top-k (``kernel/triton/topk_route.py``) against torch's topk and softmax, both
routings, on the expert counts of the MoE families (gpt-oss 32 top 4, Qwen3-MoE 128 top 8, Qwen3.6
256 top 8) and a count that is not a power of two."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton.topk_route import topk_route  # noqa: E402

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("tokens,experts,k", [(1, 32, 4), (37, 32, 4), (5, 128, 8), (3, 256, 8),
                                              (9, 60, 4)])
@pytest.mark.parametrize("routing", ["topk_softmax", "softmax", "softmax_renorm"])
def test_matches_torch(tokens, experts, k, routing):
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(experts))
    logits = logits.to(DEV, torch.bfloat16)
    if routing == "topk_softmax":
        values, ref_ids = torch.topk(logits, k, dim=-1)
        ref = values.float().softmax(-1)
    else:
        ref, ref_ids = torch.topk(logits.float().softmax(-1), k, dim=-1)
        if routing == "softmax_renorm":
            ref = ref / ref.sum(-1, keepdim=True)
    weights, ids = topk_route(logits, k, routing != "topk_softmax", routing == "softmax_renorm")
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref, rtol=1e-6, atol=1e-6)


def test_ties_pick_the_lowest_expert():
    logits = torch.zeros(2, 8, device=DEV)
    logits[1, 5] = 1.0
    weights, ids = topk_route(logits, 2, softmax_first=False)
    assert ids.tolist() == [[0, 1], [5, 0]]
    torch.testing.assert_close(weights[0], torch.full((2,), 0.5, device=DEV))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's NaN math
@pytest.mark.parametrize("softmax_first", [False, True])
def test_nan_rows_pick_experts_that_exist(softmax_first):
    """A padding row's logits may be stale memory; NaN ranks above every number (as in
    ``torch.topk``), so its ids stay in range (an id of ``experts`` would index past every
    per-expert table), and the rows beside it are untouched."""
    experts, k = 60, 4  # the tile is 64 wide: its padding lanes must never be picked
    logits = torch.randn(3, experts, generator=torch.Generator().manual_seed(1)).to(DEV)
    logits[0] = float("nan")
    logits[1, 17] = float("nan")
    _, ids = topk_route(logits, k, softmax_first)
    assert ((ids >= 0) & (ids < experts)).all()
    assert len(set(ids[0].tolist())) == k
    if not softmax_first:  # one NaN: first, as torch.topk ranks it; the rest by value
        assert torch.equal(ids[1:], torch.topk(logits[1:], k, dim=-1).indices)
    _, clean = topk_route(logits[2:], k, softmax_first)
    assert torch.equal(ids[2:], clean)
