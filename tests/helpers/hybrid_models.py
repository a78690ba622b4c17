"""Tiny random checkpoints of the hybrid Gated DeltaNet families (Qwen3-Next, Qwen3.5 dense and
MoE), built and saved by transformers, every parameter perturbed (``hf_models``' scheme)."""

from __future__ import annotations

import functools
import importlib
import json
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from helpers.hf_models import BOS_TOKEN_ID, EOS_TOKEN_ID, _perturb_parameters, _perturb_seed

HYBRID_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


@functools.lru_cache(maxsize=None)
def reference_on_torch_kernels() -> None:
    """transformers binds its Gated DeltaNet functions to flash-linear-attention's kernels when
    ``fla`` imports (at the modeling module's import) and then calls them on the CPU tensors of
    the float32 reference, which fails (Triton wants CUDA pointers). Import those modules once with
    ``fla`` hidden, so the reference keeps its torch paths; minisgl imports fla afterwards.
    Called before the first reference is built, not at import: the modules import triton, which
    the interpreter tests must import first (``helpers/interpreter.py``)."""
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "fla" or
             k.startswith("fla.")}
    sys.modules["fla"] = None  # type: ignore[assignment]  (an import of it raises ImportError)
    try:
        for arch in HYBRID_ARCHS:
            try:
                importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
            except ImportError:
                pass
    finally:
        del sys.modules["fla"]
        sys.modules.update(saved)


_TEXT = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=512,
    rms_norm_eps=1e-6, bos_token_id=BOS_TOKEN_ID, eos_token_id=EOS_TOKEN_ID, hidden_act="silu",
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=False,
    # attention at layers 3 and 5: runs of linear layers of different lengths
    layer_types=["linear_attention"] * 3 + ["full_attention", "linear_attention",
                                            "full_attention"],
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, norm_topk_prob=True)
_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
               patch_size=4, spatial_merge_size=2, temporal_patch_size=2)


def _model(arch: str):
    import transformers as tf

    if arch == "qwen3_next":
        cfg = tf.Qwen3NextConfig(**_TEXT, **_MOE, decoder_sparse_step=1, mlp_only_layers=[],
                                 rope_parameters=dict(_ROPE))
        return tf.Qwen3NextForCausalLM(cfg)
    rope = {**_ROPE, "mrope_section": [2, 1, 1], "mrope_interleaved": True}
    text = {**_TEXT, "rope_parameters": rope}
    if arch == "qwen3_5":
        cfg = tf.Qwen3_5Config(text_config=text, vision_config=_VISION)
        return tf.Qwen3_5ForConditionalGeneration(cfg)
    cfg = tf.Qwen3_5MoeConfig(text_config={**text, **_MOE}, vision_config=_VISION)
    return tf.Qwen3_5MoeForConditionalGeneration(cfg)


def make_hybrid_checkpoint(arch: str, out_dir: str | Path, seed: int = 0) -> Path:
    reference_on_torch_kernels()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = _model(arch).to(torch.float32).eval()
    _perturb_parameters(model, _perturb_seed(arch, seed))
    with torch.no_grad():  # A_log near 0 decays little: spread it so some heads forget fast
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.linspace(-1.0, 1.0, p.numel()))
    model.save_pretrained(out, safe_serialization=True)
    gen = {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen) + "\n")
    return out


def _tensors(src: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def _copy_side_files(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy(f, out / f.name)


def save_sharded(src: str | Path, out: str | Path, shards: int,
                 dtype: torch.dtype = torch.bfloat16) -> Path:
    """``src``'s tensors in ``dtype``, in ``shards`` files of about equal size cut without regard
    to layers (a layer may span two files), named as transformers names them."""
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    _copy_side_files(src, out)
    tensors = {k: v.to(dtype) for k, v in sorted(_tensors(src).items())}
    total, size, part, parts = sum(t.numel() for t in tensors.values()), 0, {}, []
    for name, t in tensors.items():
        part[name] = t
        size += t.numel()
        if size >= total * (len(parts) + 1) / shards and len(parts) < shards - 1:
            parts.append(part)
            part = {}
    parts.append(part)
    for i, part in enumerate(parts):
        save_file(part, str(out / f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"),
                  metadata={"format": "pt"})
    return out


_EXPERT = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def stack_experts(src: str | Path, out: str | Path) -> Path:
    """``src`` with each layer's experts stacked as transformers 5 saves them
    (``experts.gate_up_proj [E, 2I, H]``: each expert's gate rows then its up rows;
    ``experts.down_proj [E, H, I]``), in two shards."""
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    _copy_side_files(src, out)
    tensors = _tensors(src)
    stacked: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name in [n for n in tensors if _EXPERT.match(n)]:
        prefix, e, kind = _EXPERT.match(name).groups()
        stacked.setdefault(prefix, {}).setdefault(int(e), {})[kind] = tensors.pop(name)
    for prefix, experts in stacked.items():
        order = [experts[e] for e in sorted(experts)]
        tensors[prefix + ".gate_up_proj"] = torch.stack([torch.cat([x["gate"], x["up"]])
                                                         for x in order])
        tensors[prefix + ".down_proj"] = torch.stack([x["down"] for x in order])
    names = sorted(tensors)
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        save_file({n: tensors[n] for n in part}, str(out / f"model-{i + 1:05d}-of-00002"
                                                    ".safetensors"))
    return out


# what Qwen's FP8 checkpoints of the hybrid families store in e4m3 with a weight_scale_inv per
# block: attention, the Gated DeltaNet projections but for in_proj_b / in_proj_a, the dense MLPs,
# the experts and the shared expert; embeddings, LM head, norms, conv, router and the shared
# expert's gate stay unquantized
QWEN_FP8_QUANTIZED = re.compile(
    r"layers\.\d+\.(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkvz?|in_proj_z|out_proj)"
    r"|mlp\.(experts\.\d+\.|shared_expert\.)?(gate|up|down)_proj)\.weight$")


def make_qwen_fp8_checkpoint(src: str | Path, out: str | Path,
                             block: tuple[int, int] = (128, 128)) -> Path:
    """A hybrid checkpoint in the layout of Qwen's FP8 releases (Qwen3.5-*-FP8, Qwen3.6-*-FP8):
    ``QWEN_FP8_QUANTIZED`` weights quantized by the tests' own block quantizer
    (``helpers.fp8_models.quantize``), everything else as it was, and the ``quantization_config``
    those checkpoints carry (block FP8, dynamic activations)."""
    from safetensors.torch import save_file

    from helpers.fp8_models import quantize

    src, out = Path(src), Path(out)
    _copy_side_files(src, out)
    result = {}
    for name, t in _tensors(src).items():
        if QWEN_FP8_QUANTIZED.search(name) and not name.startswith("mtp."):
            result[name], result[name + "_scale_inv"] = quantize(t, block)
        else:
            result[name] = t
    save_file(result, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": list(block),
        "modules_to_not_convert": ["lm_head", "model.language_model.embed_tokens", "model.visual",
                                   "mtp", "linear_attn.in_proj_a", "linear_attn.in_proj_b",
                                   "mlp.gate", "mlp.shared_expert_gate"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def add_mtp_head(path, seed: int = 0) -> None:
    """Give a saved checkpoint an ``mtp.`` head: its full-attention layer 3 (dense MLP or MoE,
    whatever the model has) perturbed, plus random fc and norms; ``mtp_num_hidden_layers: 1``."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        prefix = next(k for k in f.keys() if k.endswith("layers.3.input_layernorm.weight"))
        prefix = prefix.removesuffix("layers.3.input_layernorm.weight")
        for key in f.keys():
            if key.startswith(prefix + "layers.3."):
                t = f.get_tensor(key)
                noise = torch.randn(t.shape, generator=gen) * 0.05
                tensors["mtp.layers.0." + key.removeprefix(prefix + "layers.3.")] = t + noise
        hidden = f.get_tensor(prefix + "norm.weight").shape[0]
    tensors["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=gen) * 0.1
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{name}.weight"] = torch.randn(hidden, generator=gen) * 0.1
    save_file(tensors, str(path / "mtp.safetensors"))
    config = json.loads((path / "config.json").read_text())
    (config.get("text_config") or config)["mtp_num_hidden_layers"] = 1
    (path / "config.json").write_text(json.dumps(config))
