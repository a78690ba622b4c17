"""Where weights come from: a local HF directory, a Hugging Face repo id, a ``.gguf`` file, or random.

Everything is turned into a local directory with ``config.json`` (``resolve_model_path``) and then
streamed tensor by tensor into the model, each rank keeping only its shards (``load_weights``).
"""

from __future__ import annotations

import glob
import hashlib
import os
from typing import Iterator

import torch
from tqdm import tqdm

from minisgl.utils import init_logger

logger = init_logger(__name__)


def resolve_model_path(model: str | None) -> str:
    """Return a local directory holding ``config.json`` (and weights, tokenizer) for ``model``."""
    if model is None:
        from minisgl.utils.default_model import default_model_path

        return default_model_path()
    if os.path.isfile(model) and model.endswith(".gguf"):
        return _gguf_to_dir(model)
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise FileNotFoundError(f"model directory {model!r} has no config.json")
        return model
    if os.path.exists(model) or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise FileNotFoundError(
            f"model {model!r} is neither a local directory, a .gguf file nor a Hugging Face repo id"
        )
    return _download(model)


def _download(repo_id: str) -> str:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        return snapshot_download(repo_id, allow_patterns=patterns)
    except Exception as e:  # offline, unknown repo, gated: one clear line
        raise FileNotFoundError(
            f"model {repo_id!r} is not a local path and could not be fetched from the Hugging Face "
            f"Hub ({type(e).__name__}: {e})"
        ) from None


def _gguf_to_dir(path: str) -> str:
    """Dequantize once into a cached HF directory, keyed by the file's identity."""
    from minisgl.utils.default_model import cache_root, convert_gguf_cached

    stat = os.stat(path)
    key = hashlib.sha1(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    out = os.path.join(cache_root(), f"gguf-{os.path.basename(path)[:-5]}-{key.hexdigest()[:10]}")
    return convert_gguf_cached(path, out)


def iter_weights(model_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream every tensor of the directory's safetensors files, with a progress bar."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir!r}")
    for file in tqdm(files, desc="Loading weights", unit="file", disable=len(files) < 2):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    """Random weights of a realistic scale, for benchmarks without a checkpoint."""
    gen: torch.Generator | None = None
    for name, param in model.named_parameters():
        if gen is None:
            gen = torch.Generator(device=param.device).manual_seed(seed)
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)
