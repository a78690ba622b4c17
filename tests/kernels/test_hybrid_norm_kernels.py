"""The hybrid models' fused kernels against their torch references: the ``(1 + w)`` RMSNorm and
the gated RMSNorm (``kernel/triton/norm.py``), and the q/k norm + partial RoPE of gated attention
(``kernel/triton/partial_rope.py``).

Without a GPU they run under the Triton interpreter on fp32 data; on CUDA on bf16, where the
kernels round as the references do step by step, so the results agree to the last bit or one
rounding step."""

from __future__ import annotations

import pytest
import torch

from helpers.interpreter import import_triton

triton = import_triton()

from minisgl.kernel.triton import norm as triton_norm
from minisgl.kernel.triton.partial_rope import qk_norm_partial_rope
from minisgl.layers import RMSNorm, RotaryEmbedding
from minisgl.layers import gated_delta as ops
from minisgl.layers.rotary import cos_sin_cache
from minisgl.models.config import RotaryConfig

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32
TOL = dict(atol=2e-2, rtol=2e-2) if DEV == "cuda" else dict(atol=1e-5, rtol=1e-5)


def _randn(*shape, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(DEV, DTYPE)


def _offset_norm(dim: int) -> RMSNorm:
    norm = RMSNorm(dim, 1e-6, offset=1.0)
    norm.weight.data = _randn(dim, seed=1, scale=0.3).cpu()
    return norm


@pytest.mark.any_device
@pytest.mark.parametrize("residual", [False, True])
def test_offset_rms_norm_matches_the_reference(residual) -> None:
    norm = _offset_norm(96)
    x, r = _randn(5, 96, seed=2), _randn(5, 96, seed=3)
    ref = norm.add_norm(x.cpu(), r.cpu()) if residual else norm(x.cpu())
    w = norm.weight.data.to(DEV)
    if residual:
        out, res = triton_norm.fused_add_rms_norm(x, r, w, 1e-6, offset=True)
        torch.testing.assert_close(res.cpu(), ref[1], **TOL)
        ref = ref[0]
    else:
        out = triton_norm.rms_norm(x, w, 1e-6, offset=True)
    torch.testing.assert_close(out.cpu(), ref, **TOL)


@pytest.mark.any_device
def test_gated_rms_norm_matches_the_reference() -> None:
    t, heads, dim = 4, 3, 32
    x = _randn(t, heads, dim, seed=4)
    fused = _randn(t, heads * dim + 7, seed=5)  # the gate as a strided slice of a projection
    gate = fused[:, 7:].reshape(t, heads, dim)
    w = _randn(dim, seed=6)
    ref = ops.gated_rms_norm(x.cpu(), gate.cpu(), w.cpu(), 1e-6)
    out = triton_norm.gated_rms_norm(x, gate, w, 1e-6)
    torch.testing.assert_close(out.cpu(), ref, **TOL)


@pytest.mark.any_device
def test_qk_norm_partial_rope_matches_the_reference() -> None:
    t, hq, hk, dim = 6, 4, 2, 64
    rotary = RotaryConfig(head_dim=16, base=10000.0, max_position=64)
    q_norm, k_norm = _offset_norm(dim), _offset_norm(dim)
    k_norm.weight.data = _randn(dim, seed=7, scale=0.3).cpu()
    # q beside its gate in each head's row; k a slice of a fused projection
    q_gate = _randn(t, hq, 2 * dim, seed=8)
    q = q_gate[..., :dim]
    k = _randn(t, hk * dim + 32, seed=9)[:, 32:].reshape(t, hk, dim)
    positions = torch.tensor([0, 5, 9, 17, 40, 63], device=DEV)
    cos, sin = cos_sin_cache(rotary, torch.device(DEV)).chunk(2, dim=-1)
    out_q, out_k = qk_norm_partial_rope(q, k, positions, cos, sin, q_norm.weight.data.to(DEV),
                                        k_norm.weight.data.to(DEV), 1e-6)
    ref_q, ref_k = RotaryEmbedding(rotary)(positions.cpu(), q_norm(q.cpu()), k_norm(k.cpu()))
    assert out_q.is_contiguous() and out_k.is_contiguous()
    torch.testing.assert_close(out_q.cpu(), ref_q, **TOL)
    torch.testing.assert_close(out_k.cpu(), ref_k, **TOL)
