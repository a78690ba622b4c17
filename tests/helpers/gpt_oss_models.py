"""Tiny random gpt-oss checkpoints: transformers' float32 model with every parameter perturbed,
and the same model with MXFP4 experts (quantized by the tests' own quantizer, ``helpers.mxfp4``)
beside the float32 model of exactly the weights those stand for, which transformers runs as the
reference.

The config is built to make each feature matter: a window of 8 tokens on every other layer (the
prompts are longer), YaRN with a small original context (its ramp crosses the head), sinks and
biases of unit scale, and experts whose pre-activations cross the SwiGLU limit. The limit is the
released models' 7.0: transformers before 5.2x ignores the config's ``swiglu_limit`` and
``swiglu_alpha`` (its experts hard-code 7.0 and 1.702), so another value would make the reference
depend on the installed version.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from helpers import mxfp4
from helpers.hf_models import BOS_TOKEN_ID, EOS_TOKEN_ID

WINDOW = 8
_STD = {  # (mean, std) by parameter name suffix; the first match wins
    "norm.weight": (1.0, 0.1),
    "bias": (0.0, 0.1),
    "sinks": (0.0, 1.0),
    "router.weight": (0.0, 1.0),
    "experts.gate_up_proj": (0.0, 0.6),  # pre-activations of std ~5: about 1 in 6 clamped
    "experts.down_proj": (0.0, 0.15),
    "embed_tokens.weight": (0.0, 1.0),
    "lm_head.weight": (0.0, 1.5),
}
_LINEAR = (0.0, 0.12)


def config(**overrides):
    from transformers import GptOssConfig

    kwargs = dict(
        hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW, swiglu_limit=7.0,
        rms_norm_eps=1e-6, bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 64, "truncate": False,
                         "rope_theta": 10000.0},
    )
    kwargs.update(overrides)
    return GptOssConfig(**kwargs)


def _std(name: str) -> tuple[float, float]:
    return next((std for suffix, std in _STD.items() if name.endswith(suffix)), _LINEAR)


@torch.no_grad()
def make_gpt_oss_checkpoint(out_dir: str | Path, seed: int = 0, **overrides) -> Path:
    """Save a tiny random gpt-oss (float32, every parameter perturbed) to ``out_dir``."""
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    cfg = config(**overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    for name, p in model.named_parameters():
        mean, std = _std(name)
        gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
        p.copy_(mean + std * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out, safe_serialization=True)
    gen_cfg = {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg) + "\n")
    return out


def make_mxfp4_pair(src: str | Path, mx_dir: str | Path, ref_dir: str | Path) -> tuple[Path, Path]:
    """From a float32 checkpoint: ``mx_dir`` with MXFP4 experts (gpt-oss's released layout and
    ``quantization_config``) and ``ref_dir``, the float32 checkpoint of the dequantized experts."""
    src, mx_dir, ref_dir = Path(src), Path(mx_dir), Path(ref_dir)
    tensors = load_file(src / "model.safetensors")
    mx, ref = {}, {}
    for name, t in tensors.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            mx[name] = ref[name] = t
            continue
        blocks, scales = mxfp4.quantize(t.transpose(1, 2))  # [E, N, K] rows
        mx[name + "_blocks"], mx[name + "_scales"] = blocks.contiguous(), scales.contiguous()
        ref[name] = mxfp4.dequantize(blocks, scales).transpose(1, 2).contiguous()
    raw = json.loads((src / "config.json").read_text())
    for out, weights in ((mx_dir, mx), (ref_dir, ref)):
        out.mkdir(parents=True, exist_ok=True)
        save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
        (out / "generation_config.json").write_text((src / "generation_config.json").read_text())
    (ref_dir / "config.json").write_text(json.dumps(raw, indent=2))
    raw["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    (mx_dir / "config.json").write_text(json.dumps(raw, indent=2))
    return mx_dir, ref_dir
