from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

# Without CUDA the Triton kernel tests run in the interpreter (helpers/interpreter.py), which must
# be switched on before anything imports triton: transformers' hybrid models do at their import.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items):
    """``gpu`` tests skip without CUDA; ``any_device`` tests also carry ``gpu``, so
    ``pytest -m gpu`` is the whole GPU suite (run it with ``MINISGL_TEST_DEVICE=cuda``)."""
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if skip is not None and item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
        if item.get_closest_marker("any_device") is not None:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """One tiny, fully perturbed random checkpoint per architecture."""
    from helpers.hf_models import ARCHS, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_checkpoint(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def default_model_dir(tmp_path_factory):
    """The default model, converted once per session into a fresh cache (the conversion is
    tested)."""
    from minisgl.models import default_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINISGL_CACHE_DIR", str(tmp_path_factory.mktemp("minisgl_cache")))
        return default_model.default_model_path()
