"""The decoder layer's RMSNorm computed inside the GEMV that reads it (``layers/norm.py``'s
``PendingNorm``, ``kernel/triton/gemv.py``'s ``PreNorm``): on the CPU the norm runs first as before;
on a GPU one-token steps normalise inside the QKV and gate-up GEMVs (bf16 and FP8 weights) and give
the tokens and, within bf16's rounding of the normalised input, the logits of the unfused norm."""

from __future__ import annotations

import pytest
import torch

from minisgl.layers import PendingNorm, RMSNormFused


def _norm(dim: int = 64) -> RMSNormFused:
    norm = RMSNormFused(dim, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(dim, generator=torch.Generator().manual_seed(0)))
    return norm


def test_pending_norm_value_is_the_fused_norm():
    norm, x, residual = _norm(), torch.randn(2, 64), torch.randn(2, 64)
    pending = PendingNorm(norm, x, residual)
    want, want_residual = norm(x, residual)
    assert torch.equal(pending.value(), want)
    assert torch.equal(pending.residual, want_residual)


def test_pending_norm_of_layer_0_keeps_x_as_the_residual():
    norm, x = _norm(), torch.randn(1, 64)
    pending = PendingNorm(norm, x, None)
    assert torch.equal(pending.value(), norm(x, None)[0]) and pending.residual is x
    prenorm = PendingNorm(norm, x, None)
    args = prenorm.prenorm()  # what a GEMV would take: no residual to add or write
    assert prenorm.residual is x and args.residual is None and args.residual_out is None
    assert args.weight is norm.weight and args.eps == norm.eps


def test_pending_norm_read_before_it_is_computed_is_an_error():
    with pytest.raises(AssertionError, match="never read"):
        _ = PendingNorm(_norm(), torch.randn(1, 64), torch.randn(1, 64)).residual


def _decode(path: str, on: str, quantization: str | None, monkeypatch):
    from hf_models import random_prompts
    from minisgl import LLM, SamplingParams

    monkeypatch.setenv("MINISGL_NORM_GEMV", on)
    llm = LLM(path, device="cuda", dtype="bfloat16", num_pages=2048, quantization=quantization)
    engine, logits = llm.scheduler.engine, []
    forward = engine.forward

    def recorded(batch, args):
        out = forward(batch, args)
        logits.append(out.logits.float().clone())
        return out

    engine.forward = recorded
    prompts = random_prompts(2, [7, 30], 256, seed=3)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (4, 24)]
    tokens = [o.token_ids for o in llm.generate(prompts, params)]
    llm.close()
    return tokens, logits


@pytest.mark.gpu
@pytest.mark.parametrize("quantization", [None, "fp8"])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_normalising_gemv_gives_the_unfused_tokens_and_logits(arch, quantization, tiny_checkpoints,
                                                             monkeypatch):
    """The last 20 tokens of the second request decode alone (one-token steps, CUDA graphs on).
    The fused GEMV multiplies by the reciprocal RMS in fp32 where the unfused norm rounds the
    normalised x to bf16 first (0.4% per element at most): logits within 2% of their scale."""
    path = str(tiny_checkpoints[arch])
    tokens, logits = _decode(path, "1", quantization, monkeypatch)
    ref_tokens, ref_logits = _decode(path, "0", quantization, monkeypatch)
    assert tokens == ref_tokens
    assert len(logits) == len(ref_logits) and sum(out.shape[0] == 1 for out in logits) >= 16
    for got, want in zip(logits, ref_logits):
        torch.testing.assert_close(got, want, rtol=0, atol=0.02 * want.abs().max().item())
