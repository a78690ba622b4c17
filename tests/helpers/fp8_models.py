"""Tiny checkpoints in the format of the published FP8 checkpoints (Qwen3-*-FP8, DeepSeek-V3).

``make_fp8_checkpoint`` turns a tiny float32 checkpoint (``hf_models.make_tiny_checkpoint``) into
one: every projection weight of the decoder layers (q/k/v/o, gate/up/down, each expert's) becomes
e4m3 with a float32 ``weight_scale_inv`` per block, and ``config.json`` gains a
``quantization_config``; embeddings, the LM head, norms and the MoE router stay as they were
(float32 here, bf16 in the published ones).
``make_dequantized_checkpoint`` writes the same model with the weights ``q * scale_inv`` in float32:
the reference an FP8 model must match. The quantizer here is written independently of
``minisgl.quant`` (a loop over blocks), so a shared mistake cannot hide.
"""

from __future__ import annotations

import glob
import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

QUANTIZED = re.compile(
    r"layers\.\d+\.(self_attn|mlp)\.(experts\.\d+\.)?(q|k|v|o|gate|up|down)_proj\.weight$")


def quantize(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    bn, bk = block
    n, k = w.shape
    q = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    s = torch.empty(-(-n // bn), -(-k // bk))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            tile = w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].float()
            s[i, j] = tile.abs().max() / 448.0
            q[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] = (tile / s[i, j]).to(torch.float8_e4m3fn)
    return q, s


def dequantize(q: torch.Tensor, s: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    bn, bk = block
    w = q.float()
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk] *= s[i, j]
    return w


def dequantize_scaled(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 weight times its per-row (``[N, 1]``) or per-block scales, in float32 (a partial
    last block where the shape is not a multiple of the block)."""
    w = weight.float()
    if scale.shape[-1] == 1 and scale.dim() == w.dim():
        return w * scale
    rows, cols = -(-w.shape[-2] // scale.shape[-2]), -(-w.shape[-1] // scale.shape[-1])
    full = scale.repeat_interleave(rows, -2).repeat_interleave(cols, -1)
    return w * full[..., : w.shape[-2], : w.shape[-1]]


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-output-channel quantization, row by row: (e4m3 [N, K], float32 scales [N, 1])."""
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn)
    s = torch.empty(w.shape[0], 1)
    for i, row in enumerate(w.float()):
        s[i, 0] = row.abs().max().clamp_min(1e-12) / 448.0  # an all-zero row: a finite scale
        q[i] = (row / s[i, 0]).to(torch.float8_e4m3fn)
    return q, s


# a layer's RMSNorm and the projections whose columns ``--quantization fp8`` multiplies it into
FOLDS = {"input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj")}


def fold_norms(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The norms of every layer with a dense MLP multiplied into the columns of the projections
    they feed, and set to one (the model computes the same function)."""
    tensors = dict(tensors)
    layers = {m.group(1) for m in map(re.compile(r"(.*layers\.\d+)\.mlp\.gate_proj\.weight$").match,
                                      tensors) if m}
    for layer in layers:
        for norm, projections in FOLDS.items():
            g = tensors[f"{layer}.{norm}.weight"].float()
            for proj in projections:
                name = f"{layer}.{proj}.weight"
                tensors[name] = tensors[name].float() * g
            tensors[f"{layer}.{norm}.weight"] = torch.ones_like(tensors[f"{layer}.{norm}.weight"])
    return tensors


def make_online_reference_checkpoint(src: str | Path, out: str | Path) -> Path:
    """What ``--quantization fp8`` makes of ``src``, dequantized to float32: the norms of the dense
    layers folded into the projections after them (``fold_norms``), the dense projections quantized
    per output channel, the MoE experts in 128x128 blocks (they keep block scales)."""
    src, out = Path(src), Path(out)
    _copy_side_files(src, out)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(glob.glob(str(src / "*.safetensors"))):
        tensors.update(load_file(f))
    result = {}
    for name, t in fold_norms(tensors).items():
        match = QUANTIZED.search(name)
        if match and match.group(2):  # an expert
            result[name] = dequantize(*quantize(t, (128, 128)), (128, 128))
        elif match:
            q, s = quantize_rows(t)
            result[name] = q.float() * s
        else:
            result[name] = t
    save_file(result, str(out / "model.safetensors"))
    shutil.copy(src / "config.json", out / "config.json")
    return out


def _copy_side_files(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "config.json":
            shutil.copy(f, out / f.name)


def make_fp8_checkpoint(src: str | Path, out: str | Path, block: tuple[int, int] = (128, 128),
                        kv_scales: dict[int, tuple[float, float]] | None = None) -> Path:
    """``kv_scales``: per-layer (k_scale, v_scale) tensors to add (``self_attn.k_scale``)."""
    src, out = Path(src), Path(out)
    _copy_side_files(src, out)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(glob.glob(str(src / "*.safetensors"))):
        tensors.update(load_file(f))
    result: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if QUANTIZED.search(name):
            q, s = quantize(t, block)
            result[name], result[name + "_scale_inv"] = q, s
        else:
            result[name] = t
    for layer, (ks, vs) in (kv_scales or {}).items():
        result[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(ks)
        result[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(vs)
    save_file(result, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                  "quant_method": "fp8", "weight_block_size": list(block)}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def make_dequantized_checkpoint(fp8_dir: str | Path, out: str | Path) -> Path:
    """The FP8 checkpoint's model in float32 (weights dequantized), without quantization_config."""
    fp8_dir, out = Path(fp8_dir), Path(out)
    _copy_side_files(fp8_dir, out)
    cfg = json.loads((fp8_dir / "config.json").read_text())
    block = tuple(cfg.pop("quantization_config")["weight_block_size"])
    tensors = load_file(str(fp8_dir / "model.safetensors"))
    result = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv") or name.endswith(("k_scale", "v_scale")):
            continue
        if name + "_scale_inv" in tensors:
            result[name] = dequantize(t, tensors[name + "_scale_inv"], block)
        else:
            result[name] = t.float()
    save_file(result, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
