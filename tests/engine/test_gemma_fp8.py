"""Gemma 4 under ``--quantization fp8`` on CPU (the tiny random checkpoint, float32): the dense
projections quantized per output channel and the MoE block's experts in 128x128 blocks, through
the MoE quantization seam as every MoE family's. The model is the model of its own dequantized
weights (the CPU path dequantizes, so only the order of the sums differs), and not the float32
model (quantization happened)."""

from __future__ import annotations

import torch

from helpers.engine_utils import prefill_logits
from helpers.fp8_models import dequantize_scaled
from helpers.gemma_models import make_gemma_checkpoint
from helpers.hf_models import random_prompts
from minisgl import LLM

FP8 = torch.float8_e4m3fn
PROMPTS = random_prompts(3, [5, 23, 41], 256, seed=0)


def make_llm(path, **options) -> LLM:
    return LLM(str(path), device="cpu", dtype="float32", num_pages=4096, cache="naive", **options)


def test_gemma4_fp8_is_the_dequantized_model(tmp_path):
    from minisgl.quant.fp8_block import Fp8MoEMethod

    path = make_gemma_checkpoint("gemma4", tmp_path / "gemma4")
    llm = make_llm(path, quantization="fp8")
    model = llm.scheduler.engine.model
    for layer in model.layers:
        assert isinstance(layer.moe.method, Fp8MoEMethod)
        assert layer.moe.w13.dtype == FP8 and layer.moe.w2.dtype == FP8
        assert layer.self_attn.qkv_proj.weight.dtype == FP8
        assert layer.moe.gate.weight.dtype == torch.float32  # the router is never quantized
    ref = make_llm(path)
    fp32 = prefill_logits(ref.scheduler, PROMPTS)
    params = dict(ref.scheduler.engine.model.named_parameters())
    quantized = dict(model.named_parameters())
    copied = 0
    for name, param in quantized.items():
        if param.dtype == FP8:
            params[name].data.copy_(dequantize_scaled(param, quantized[name + "_scale_inv"]))
            copied += 1
    assert copied == 6 * len(model.layers)  # qkv, o, gate-up, down, w13, w2
    logits = prefill_logits(llm.scheduler, PROMPTS)
    torch.testing.assert_close(logits, prefill_logits(ref.scheduler, PROMPTS), atol=1e-4, rtol=0)
    assert (logits - fp32).abs().max() > 1e-3
