"""Tiny random Gemma 3 checkpoints (text ``Gemma3ForCausalLM`` and the multimodal
``Gemma3ForConditionalGeneration`` layout), built and saved by transformers, every parameter
perturbed (``hf_models``' scheme).

Six layers in Gemma 3's pattern (five sliding, one global), a window of 8 tokens so that test
prompts run past it, a query scale that is not ``head_dim ** -0.5``, linear rope scaling on the
global layer only, and final-logit soft-capping."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

from helpers.hf_models import BOS_TOKEN_ID, EOS_TOKEN_ID, _perturb_parameters, _perturb_seed

WINDOW = 8
TEXT = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512,
    rms_norm_eps=1e-6, bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=0,
    query_pre_attn_scalar=24, sliding_window=WINDOW, final_logit_softcapping=30.0,
    tie_word_embeddings=True,
    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                        "rope_theta": 1_000_000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
)
_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
               image_size=28, patch_size=14)


GEMMA4_TEXT = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
    attention_k_eq_v=True, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-6,
    bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, pad_token_id=0, sliding_window=WINDOW,
    final_logit_softcapping=30.0, enable_moe_block=True, num_experts=4, top_k_experts=2,
    moe_intermediate_size=32, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1_000_000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    tie_word_embeddings=True,
)


def _model(arch: str):
    import transformers as tf

    if arch == "gemma4":
        return tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**GEMMA4_TEXT))
    text = tf.Gemma3TextConfig(**TEXT)
    if arch == "gemma3":
        return tf.Gemma3ForCausalLM(text)
    # the image tokens lie outside the test prompts' vocabulary: transformers treats them apart
    cfg = tf.Gemma3Config(text_config=text, vision_config=_VISION, mm_tokens_per_image=4,
                          image_token_index=1000, boi_token_index=1001, eoi_token_index=1002)
    return tf.Gemma3ForConditionalGeneration(cfg)


def make_gemma_checkpoint(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    """``arch``: ``gemma3`` (text), ``gemma3_mm`` (the multimodal layout) or ``gemma4`` (MoE
    block, global layers of their own head size and KV heads with K = V, proportional RoPE)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = _model(arch).to(torch.float32).eval()
    _perturb_parameters(model, _perturb_seed(arch, seed))
    with torch.no_grad():  # layer scalars are buffers (saved, not parameters): spread them too
        for name, buf in model.named_buffers():
            if name.endswith("layer_scalar"):
                buf.fill_(0.5 + (zlib.crc32(name.encode()) % 100) / 100)
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    gen = {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen) + "\n")
    return out
