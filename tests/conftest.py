from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))  # tests import their helpers (hf_models) by name

import pytest
import torch

# MINISGL_TEST_DEVICE=cuda runs the engine tests on the GPU (float32, against CPU transformers)
TEST_DEVICE = os.environ.get("MINISGL_TEST_DEVICE", "cpu")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """One tiny, fully perturbed random checkpoint per architecture."""
    from hf_models import ARCHS, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    return {arch: make_tiny_checkpoint(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def default_model_dir(tmp_path_factory):
    """The default model, converted once per session into a fresh cache (the conversion is tested)."""
    from minisgl.utils import default_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINISGL_CACHE_DIR", str(tmp_path_factory.mktemp("minisgl_cache")))
        return default_model.default_model_path()
