"""A hybrid model's linear-attention library is imported on a thread while the weights load."""

import sys
import threading

import pytest
import torch

from minisgl.linear_attn import prefetch_linear_attn_backend


@pytest.fixture(autouse=True)
def _no_fla_left():
    """The fake package must not outlive its test (another may ask whether fla installs)."""
    saved = {k: v for k, v in sys.modules.items() if k == "fla" or k.startswith("fla.")}
    yield
    for k in [k for k in sys.modules if k == "fla" or k.startswith("fla.")]:
        del sys.modules[k]
    sys.modules.update(saved)


def _fake_fla(tmp_path, body: str) -> None:
    pkg = tmp_path / "fla" / "ops" / "gated_delta_rule"
    pkg.mkdir(parents=True)
    (tmp_path / "fla" / "__init__.py").write_text("")
    (tmp_path / "fla" / "ops" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(body)


def _join_prefetch() -> None:
    for t in threading.enumerate():
        if t.name == "minisgl-import-fla":
            t.join(timeout=30)


def test_the_triton_backend_imports_fla_on_a_thread(tmp_path, monkeypatch):
    _fake_fla(tmp_path, "import threading\nIMPORTED_ON = threading.current_thread().name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [k for k in sys.modules if k == "fla" or k.startswith("fla.")]:
        del sys.modules[name]
    prefetch_linear_attn_backend("torch", torch.device("cpu"))  # the reference imports nothing
    _join_prefetch()
    assert "fla.ops.gated_delta_rule" not in sys.modules
    prefetch_linear_attn_backend("triton", torch.device("cpu"))
    _join_prefetch()
    assert sys.modules["fla.ops.gated_delta_rule"].IMPORTED_ON == "minisgl-import-fla"


def test_an_import_error_is_left_to_the_backend(tmp_path, monkeypatch):
    _fake_fla(tmp_path, "raise ImportError('broken fla')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [k for k in sys.modules if k == "fla" or k.startswith("fla.")]:
        del sys.modules[name]
    errors = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    prefetch_linear_attn_backend("triton", torch.device("cpu"))
    _join_prefetch()
    assert errors == [] and "fla.ops.gated_delta_rule" not in sys.modules
