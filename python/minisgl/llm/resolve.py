"""``EngineOptions``' device and dtypes, ``auto`` resolved against the machine and the checkpoint.

The dtype of the weights and activations and that of a hybrid model's recurrent state are named
here (``DTYPES``, ``STATE_DTYPES``), so the options check their names against the same tables.
"""

from __future__ import annotations

import torch

from minisgl.models import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device: {name!r} is not a valid device (cpu, cuda, cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for, but no CUDA GPU is available")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device: {name!r} is not supported (cpu, cuda)")
    return device


def resolve_dtype(name: str, model_path: str, device: torch.device) -> torch.dtype:
    """``auto``: float32 on CPU; on GPU the checkpoint's dtype (float32 -> bfloat16)."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    dtype = ModelConfig.from_path(model_path).dtype
    return torch.bfloat16 if dtype == torch.float32 else dtype


def resolve_state_dtype(name: str, model_path: str) -> torch.dtype:
    """``auto``: the checkpoint's ``mamba_ssm_dtype``, else float32."""
    if name != "auto":
        return STATE_DTYPES[name]
    raw = ModelConfig.from_path(model_path).raw
    name = (raw.get("text_config") or raw).get("mamba_ssm_dtype", "float32")
    return STATE_DTYPES.get(name, torch.float32)
