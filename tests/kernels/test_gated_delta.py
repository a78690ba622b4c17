"""The torch Gated DeltaNet ops: the chunked form equals the recurrence, chunk boundaries and
state carry-over change nothing, and both match transformers' own torch fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.hybrid_models import reference_on_torch_kernels
from minisgl.layers.gated_delta import (
    causal_conv1d,
    chunk_gated_delta_rule,
    gated_rms_norm,
    gdn_gating,
    l2norm,
    recurrent_gated_delta_rule,
)

reference_on_torch_kernels()  # transformers' torch fallbacks, even with fla installed
hf = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _inputs(length: int, hk: int = 2, hv: int = 4, dk: int = 8, dv: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(length, hk, dk, generator=gen)
    k = torch.randn(length, hk, dk, generator=gen)
    v = torch.randn(length, hv, dv, generator=gen)
    a = torch.randn(length, hv, generator=gen)
    b = torch.randn(length, hv, generator=gen)
    g, beta = gdn_gating(a, b, torch.randn(hv, generator=gen) * 0.5, torch.randn(hv, generator=gen))
    state = torch.randn(hv, dk, dv, generator=gen) * 0.1
    return l2norm(q), l2norm(k), v, g, beta, state


@pytest.mark.parametrize("length,chunk", [(1, 64), (7, 4), (64, 16), (100, 64), (33, 8)])
def test_chunk_equals_recurrence(length: int, chunk: int) -> None:
    q, k, v, g, beta, state = _inputs(length)
    o1, s1 = recurrent_gated_delta_rule(q, k, v, g, beta, state, scale=8**-0.5)
    o2, s2 = chunk_gated_delta_rule(q, k, v, g, beta, state, scale=8**-0.5, chunk=chunk)
    torch.testing.assert_close(o2, o1, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s2, s1, atol=1e-5, rtol=1e-4)


def test_state_carries_across_splits() -> None:
    """Two calls that hand the state over give the output of one call over the whole sequence."""
    q, k, v, g, beta, state = _inputs(50, seed=1)
    whole, s_whole = chunk_gated_delta_rule(q, k, v, g, beta, state, 0.3, chunk=16)
    first, s = chunk_gated_delta_rule(q[:21], k[:21], v[:21], g[:21], beta[:21], state, 0.3, 16)
    second, s = recurrent_gated_delta_rule(q[21:], k[21:], v[21:], g[21:], beta[21:], s, 0.3)
    torch.testing.assert_close(torch.cat([first, second]), whole, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(s, s_whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("length", [1, 5, 70])
def test_matches_transformers(length: int) -> None:
    """transformers' fallbacks take un-normalised q/k ([B, L, H, D]) and normalise inside."""
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(length, 2, 8, generator=gen), torch.randn(length, 2, 8, generator=gen)
    _, _, v, g, beta, state = _inputs(length, seed=3)
    ref_o, ref_s = hf.torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=state[None],
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    rec_o, rec_s = hf.torch_recurrent_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=state[None],
        output_final_state=True, use_qk_l2norm_in_kernel=True)
    for fn in (recurrent_gated_delta_rule, chunk_gated_delta_rule):
        o, s = fn(l2norm(q), l2norm(k), v, g, beta, state, 8**-0.5)
        torch.testing.assert_close(o, ref_o[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(s, ref_s[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(o, rec_o[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(s, rec_s[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("splits", [(9,), (2, 7), (1, 1, 1, 6), (3, 3, 3)])
def test_conv_rolling_state(splits: tuple[int, ...]) -> None:
    """Feeding a sequence in pieces through the rolling state equals transformers' conv over the
    whole; a piece shorter than the window keeps the older inputs."""
    gen = torch.Generator().manual_seed(4)
    channels, width = 6, 4
    x = torch.randn(sum(splits), channels, generator=gen)
    weight = torch.randn(channels, width, generator=gen)
    ref = hf.causal_conv1d_fn(x.t()[None], weight, None, activation="silu")[0].t()
    state, outs, start = torch.zeros(channels, width - 1), [], 0
    for n in splits:
        out, state = causal_conv1d(x[start:start + n], weight, None, state)
        outs.append(out)
        start += n
    torch.testing.assert_close(torch.cat(outs), ref, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(state, x[-(width - 1):].t())


def test_gated_rms_norm_matches_transformers() -> None:
    gen = torch.Generator().manual_seed(5)
    x, z = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    norm = hf.Qwen3NextRMSNormGated(16, eps=1e-6)
    norm.weight.data = torch.randn(16, generator=gen)
    torch.testing.assert_close(gated_rms_norm(x, z, norm.weight.data, 1e-6), norm(x, z))
    assert not torch.allclose(gated_rms_norm(x, z, norm.weight.data, 1e-6),
                              F.silu(z) * x)  # the norm does something
