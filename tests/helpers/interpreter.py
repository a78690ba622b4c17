"""Triton for the kernel tests: compiled on a CUDA device, otherwise in Triton's interpreter."""

from __future__ import annotations

import os

import pytest
import torch
from packaging.version import Version

# the oldest Triton whose interpreter runs every kernel of the suite on CPU tensors
INTERPRETER_MIN = "3.9"


def import_triton():
    """Import triton for a kernel test module (call it before importing minisgl's kernels).

    Without CUDA, sets ``TRITON_INTERPRET=1`` first (it must precede triton's first import) and
    skips the module when the installed triton is older than the interpreter the kernels need (a
    CUDA build of torch pins an older triton; ``scripts/bootstrap.sh --test`` installs a newer one
    next to a CPU torch only)."""
    if torch.cuda.is_available():
        return pytest.importorskip("triton")
    os.environ["TRITON_INTERPRET"] = "1"
    triton = pytest.importorskip("triton")
    if Version(triton.__version__).release < Version(INTERPRETER_MIN).release:
        pytest.skip(f"the Triton interpreter tests need triton>={INTERPRETER_MIN}, installed "
                    f"{triton.__version__}", allow_module_level=True)
    return triton
