"""The fused q/k norm, RoPE and KV store (``kernel/triton/rotary.py::norm_rope_store_``) with
Gemma's norms against ``RMSNorm``'s torch reference, RoPE and the pool's ``store_kv``: the weight
(Gemma 4's ``w``, Gemma 3's ``1 + w``) multiplied in float32 and rounded once, and Gemma 4's
weightless v norm, v normalised in place and so stored."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton.rotary import norm_rope_store_  # noqa: E402
from minisgl.kvcache.mha_pool import MHAKVCache  # noqa: E402
from minisgl.layers.rotary import _rotate, cos_sin_cache  # noqa: E402
from minisgl.models.config import RotaryConfig  # noqa: E402

pytestmark = pytest.mark.any_device
DEV = "cuda" if torch.cuda.is_available() else "cpu"
INTERPRETED = DEV == "cpu"
ULP = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -8}


def _norm(x: torch.Tensor, w: torch.Tensor | None, offset: bool, eps: float) -> torch.Tensor:
    """``RMSNorm._reference`` of the float32 variants: one rounding."""
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        out = out * (w.float() + 1.0 if offset else w.float())
    return out.to(x.dtype)


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, roundings: int) -> None:
    """Two ulps compiled (the norm's sum in another order), ``roundings`` in interpreted bf16
    (which truncates), of the largest value: RoPE's difference of two products cancels, so its
    error is the products' ulp, not the result's."""
    tol = ULP[dtype] * (roundings if INTERPRETED and dtype == torch.bfloat16 else 2)
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * b.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset", [False, True])  # Gemma 4's w, Gemma 3's 1 + w
@pytest.mark.parametrize("v_norm", [False, True])
def test_gemma_norms(dtype, offset, v_norm):
    head, tokens, n_q, n_kv, eps = 64, 5, 20, 2, 1e-6
    cfg = RotaryConfig(head_dim=head, base=10000.0, max_position=512)
    g = torch.Generator().manual_seed(int(offset) + 2 * int(v_norm))
    qkv = torch.randn(tokens, (n_q + 2 * n_kv) * head, generator=g).to(DEV, dtype)
    q, k, v = (t.view(tokens, -1, head) for t in qkv.split([n_q * head, n_kv * head,
                                                            n_kv * head], dim=-1))
    pos = torch.randint(0, 500, (tokens,), generator=g).to(DEV)
    qw, kw = ((0.1 * torch.randn(head, generator=g)).to(DEV, torch.float32) for _ in range(2))
    loc = torch.randperm(16, generator=g)[:tokens].to(DEV)
    pools = [MHAKVCache(2, n_kv, head, 16, 1, dtype, DEV) for _ in range(2)]
    cos, sin = (t.to(dtype) for t in cos_sin_cache(cfg, q.device)[pos].unsqueeze(1).chunk(2, -1))
    q_ref = _rotate(_norm(q, qw, offset, eps), cos, sin)
    k_ref = _rotate(_norm(k, kw, offset, eps), cos, sin)
    v_ref = _norm(v, None, False, eps) if v_norm else v.clone()
    pools[0].store_kv(k_ref, v_ref, loc, layer_id=1)
    norm_rope_store_(pos, q, k, v, cos_sin_cache(cfg, q.device), pools[1].k_cache(1),
                     pools[1].v_cache(1), loc, qw, kw, eps, fp32_norm=True, offset=offset,
                     v_norm_eps=eps if v_norm else None)
    _close(q, q_ref, dtype, 4)  # the norm, two products and their sum
    _close(k, k_ref, dtype, 4)
    _close(v, v_ref, dtype, 1)
    _close(pools[1].k_cache(1), pools[0].k_cache(1), dtype, 4)
    _close(pools[1].v_cache(1), pools[0].v_cache(1), dtype, 1)
    assert torch.equal(pools[1].v_cache(1)[loc], v)  # the pool holds the returned v
    assert not pools[1].k_cache(0).any() and not pools[1].v_cache(0).any()


def test_an_offset_norm_is_a_float32_one():
    q = torch.zeros(1, 2, 64, device=DEV)
    cache = torch.zeros(4, 2, 64, device=DEV)
    with pytest.raises(AssertionError, match="float32"):
        norm_rope_store_(torch.zeros(1, dtype=torch.long, device=DEV), q, q.clone(), q.clone(),
                         cos_sin_cache(RotaryConfig(64, 1e4, 8), q.device), cache, cache.clone(),
                         torch.zeros(1, dtype=torch.long, device=DEV), torch.ones(64, device=DEV),
                         torch.ones(64, device=DEV), 1e-6, offset=True)
