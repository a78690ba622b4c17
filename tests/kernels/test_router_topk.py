"""The router's linear layer and top-k in one launch (``kernel/triton/router_topk.py``) against
the two launches it replaces (the linear layer, its output in x's dtype, then ``topk_route``):
gpt-oss's router (32 experts, H 2,880, a bias), Qwen3-MoE's and Gemma 4's (128 experts), a
count of experts that is not a power of two and an H that is not a multiple of the slice. The
values are exact sums (``_values``), so the ids must match exactly on the GPU too."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton.router_topk import (  # noqa: E402
    fits,
    max_tokens,
    router_topk,
    router_workspace,
)
from minisgl.kernel.triton.topk_route import topk_route  # noqa: E402

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# bf16 on the GPU only: the interpreter's bf16 dot is wrong (as ``test_mxfp4_moe.py`` notes)
DTYPES = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])


def _values(*shape, seed: int, dtype=torch.float32, scale: float = 1 / 16) -> torch.Tensor:
    """Multiples of ``scale`` up to 8 of them: every product and partial sum of the router is
    exact in float32, so its logits do not depend on the order of the sums (the tensor cores',
    the interpreter's and torch's differ) and round to bf16 alike; ties are frequent, so the
    pick's tie rule (the lowest expert) is exercised too."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-8, 9, shape, generator=g).float() * scale).to(DEV, dtype)


def _router(experts, hidden, bias, dtype, seed=0):
    w = _values(experts, hidden, seed=seed, dtype=dtype)
    b = _values(experts, seed=seed + 1, dtype=dtype) if bias else None
    return w, b


def _reference(x, w, b, k, routing):
    logits = x.float() @ w.float().T + (0 if b is None else b.float())
    return topk_route(logits.to(x.dtype), k, routing != "topk_softmax",
                      routing == "softmax_renorm")


@pytest.mark.parametrize("tokens", [1, 3, 16, 37, 64])  # one, three token blocks
@pytest.mark.parametrize("experts,hidden,k,bias,routing", [
    (32, 2880, 4, True, "topk_softmax"),      # gpt-oss
    (128, 2048, 8, False, "softmax_renorm"),  # Qwen3-MoE
    (128, 2816, 8, False, "softmax"),         # Gemma 4 (its scales come after)
    (60, 300, 4, True, "softmax"),            # ragged experts and slices
])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_the_linear_layer_then_topk(tokens, experts, hidden, k, bias, routing, dtype):
    w, b = _router(experts, hidden, bias, dtype)
    x = _values(tokens, hidden, seed=tokens, dtype=dtype)
    assert fits(x, w)
    ws = router_workspace(w)
    ref_w, ref_ids = _reference(x, w, b, k, routing)
    for _ in range(2):  # the tickets are back at zero after each call
        weights, ids = router_topk(x, w, b, k, routing != "topk_softmax",
                                   routing == "softmax_renorm", ws)
        assert not ws[1].any()
        assert ids.dtype == torch.int64 and weights.dtype == torch.float32
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tokens", [1, 20])
def test_gemma4_router_scales(tokens):
    """Gemma 4's router (``MoELayer``'s torch path): the normalised input times its learned
    scale and ``hidden ** -0.5`` (each product rounded), the linear layer, the top-k, each
    weight times its expert's scale, then the experts' dtype."""
    experts, hidden, k = 128, 2816, 8
    dtype = DTYPES[-1]
    w, _ = _router(experts, hidden, False, dtype, seed=7)
    x = _values(tokens, hidden, seed=8, dtype=dtype)
    # eighths from 1/8 to 2 and a power of two (Gemma's hidden ** -0.5 in the model): x's scaled
    # values stay exact in bf16, so the sums stay exact (``_values``)
    in_scale = _values(hidden, seed=9, dtype=dtype, scale=1 / 8).abs() + 0.125
    es = (1 + _values(experts, seed=10, dtype=torch.float32)).to(dtype)
    mult = 0.25
    ref_w, ref_ids = _reference(x * in_scale * mult, w, None, k, "softmax_renorm")
    ref_w = (ref_w * es[ref_ids]).to(dtype)
    weights, ids = router_topk(x, w, None, k, True, True, router_workspace(w), dtype,
                               in_scale=in_scale, in_mult=mult, expert_scale=es)
    assert torch.equal(ids, ref_ids) and weights.dtype == dtype
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)


def test_weights_in_the_experts_dtype_and_strided_rows():
    """x may be a view with a row stride (the MoE layer's input), the weights in the experts'
    dtype (bf16)."""
    w, b = _router(32, 512, True, DTYPES[-1], seed=3)
    x = _values(5, 1024, seed=4, dtype=DTYPES[-1])[:, :512]
    weights, ids = router_topk(x, w, b, 4, False, False, router_workspace(w),
                               dtype=torch.bfloat16)
    ref_w, ref_ids = _reference(x, w, b, 4, "topk_softmax")
    assert weights.dtype == torch.bfloat16 and torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights.float(), ref_w, rtol=1e-2, atol=1e-3)


def test_the_largest_batch_of_gpt_oss_router():
    """256 tokens (16 token blocks, each its own ticket) at gpt-oss's router."""
    w, b = _router(32, 2880, True, DTYPES[-1], seed=5)
    assert max_tokens(w) == 256
    x = _values(256, 2880, seed=6, dtype=DTYPES[-1])
    ws = router_workspace(w)
    weights, ids = router_topk(x, w, b, 4, False, False, ws)
    ref_w, ref_ids = _reference(x, w, b, 4, "topk_softmax")
    assert torch.equal(ids, ref_ids) and not ws[1].any() and ws[1].numel() == 16
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)


def test_fits_the_decode_batches_only():
    w, _ = _router(32, 2880, False, torch.bfloat16)

    def x(tokens, dtype=torch.bfloat16):
        return torch.zeros(tokens, 2880, dtype=dtype, device=DEV)

    assert fits(x(1), w) and fits(x(256), w) and not fits(x(257), w) and not fits(x(0), w)
    assert not fits(x(4, torch.float32), w)  # the dot takes one dtype
    assert not fits(x(4).t().contiguous().t(), w)  # rows of unit stride only
    wide, _ = _router(128, 2048, False, torch.bfloat16)  # 128 experts: 64 tokens
    assert max_tokens(wide) == 64
    huge, _ = _router(512, 8192, False, torch.bfloat16)  # 32 slices x 16 x 512: past the tile
    assert max_tokens(huge) == 0
