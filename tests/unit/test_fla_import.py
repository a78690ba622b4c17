"""``linear_attn.fla_import``: fla's delta rule imported without its packages' ``__init__`` files,
on a package laid out as fla's is (each case in a new process: imports are process state)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "python")

FILES = {
    "fla/__init__.py": "",
    # what the bare import must not run: every op family, and layers behind torch.compile
    "fla/ops/__init__.py": "import fla_log; fla_log.ran.append('fla.ops')\n"
                           "from .gated_delta_rule import chunk_gated_delta_rule\n",
    "fla/modules/__init__.py": "import fla_log; fla_log.ran.append('fla.modules')\n",
    "fla/modules/norm/__init__.py": "import fla_log; fla_log.ran.append('fla.modules.norm')\n",
    "fla/modules/norm/l2norm.py": "def l2norm(x):\n    return x\n",
    "fla/ops/utils.py": "def chunked(x):\n    return x\n",
    "fla/ops/gated_delta_rule/__init__.py": "from .chunk import chunk_gated_delta_rule\n",
    "fla/ops/gated_delta_rule/chunk.py": (
        "import fla.ops.utils\n"
        "from fla.modules.norm.l2norm import l2norm\n"
        "def chunk_gated_delta_rule(x):\n"
        "    return fla.ops.utils.chunked(l2norm(x))\n"),
    "fla_log.py": "ran = []\n",
}


def _run(tmp_path, code: str, files: dict[str, str] = FILES) -> str:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_rule_loads_without_the_packages_init_files(tmp_path):
    out = _run(tmp_path, """
        import sys, fla_log
        from minisgl.linear_attn.fla_import import chunk_gated_delta_rule
        rule = chunk_gated_delta_rule()
        print(rule(3), fla_log.ran, 'fla.ops' in sys.modules, 'fla.modules' in sys.modules)
        import fla.ops  # a later import of the package runs it, and finds the loaded rule
        print(fla_log.ran, fla.ops.chunk_gated_delta_rule is rule)
    """)
    assert out.splitlines() == ["3 [] False False", "['fla.ops'] True"]


def test_two_threads_get_the_same_rule(tmp_path):
    """The kernel warm-up's shadow engine and the engine import it on two threads at once."""
    files = {**FILES, "fla/ops/gated_delta_rule/chunk.py": (
        "import time\nimport fla.ops.utils\nfrom fla.modules.norm.l2norm import l2norm\n"
        "time.sleep(0.2)  # a slow import: the other thread arrives meanwhile\n"
        "def chunk_gated_delta_rule(x):\n    return fla.ops.utils.chunked(l2norm(x))\n")}
    out = _run(tmp_path, """
        import threading, fla_log
        from minisgl.linear_attn.fla_import import chunk_gated_delta_rule
        rules = []
        threads = [threading.Thread(target=lambda: rules.append(chunk_gated_delta_rule()))
                   for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(len(rules), rules[0] is rules[1], rules[0](5), fla_log.ran)
    """, files)
    assert out == "2 True 5 []"


def test_a_rule_that_needs_a_package_init_is_imported_as_usual(tmp_path):
    files = {**FILES, "fla/ops/gated_delta_rule/chunk.py": (
        "from fla.modules import helper\n"
        "def chunk_gated_delta_rule(x):\n    return helper(x)\n"),
        "fla/modules/__init__.py": ("import fla_log; fla_log.ran.append('fla.modules')\n"
                                    "def helper(x):\n    return x + 1\n")}
    out = _run(tmp_path, """
        import fla_log
        from minisgl.linear_attn.fla_import import chunk_gated_delta_rule
        print(chunk_gated_delta_rule()(3), sorted(fla_log.ran))
    """, files)
    assert out == "4 ['fla.modules', 'fla.ops']"


def test_a_missing_fla_raises_import_error(tmp_path):
    out = _run(tmp_path, """
        from minisgl.linear_attn.fla_import import chunk_gated_delta_rule
        try:
            chunk_gated_delta_rule()
        except ImportError as e:
            print('ImportError', e.name)
    """, {"fla_log.py": ""})
    assert out == "ImportError fla"


# fla's dispatch disables its wrapper, and the rule is disabled again on top (as fla 0.6 does)
DISABLED = {**FILES, "fla/ops/gated_delta_rule/chunk.py": (
    "import torch\n"
    "seen = []\n"
    "def dispatch(fn):\n    return torch.compiler.disable(fn)\n"
    "def rule(x):\n    seen.append(torch.compiler.is_compiling())\n    return x * 2\n"
    "chunk_gated_delta_rule = torch.compiler.disable(dispatch(rule))\n")}


def test_the_rule_loads_without_dynamo_and_torch_keeps_its_disable(tmp_path):
    out = _run(tmp_path, """
        import sys, torch
        real = torch.compiler.disable
        from minisgl.linear_attn.fla_import import chunk_gated_delta_rule
        rule = chunk_gated_delta_rule()
        from fla.ops.gated_delta_rule import chunk
        print(torch.compiler.disable is real, 'torch._dynamo' in sys.modules, rule(3), chunk.seen,
              rule._torchdynamo_disable, rule._torchdynamo_orig_callable is chunk.rule)
    """, DISABLED)
    assert out == "True False 6 [False] True True"


def test_a_deferred_disable_is_not_traced_by_a_later_compile(tmp_path):
    """Dynamo skips the rule as it skips a really disabled function: it runs, uncompiled, between
    two graphs (the control, the same function undisabled, is traced)."""
    out = _run(tmp_path, """
        import torch
        from minisgl.linear_attn.fla_import import chunk_gated_delta_rule
        rule = chunk_gated_delta_rule()
        from fla.ops.gated_delta_rule import chunk
        x = torch.ones(2)
        disabled = torch.compile(lambda x: rule(x + 1) - 1, backend="eager")(x)
        traced = torch.compile(lambda x: chunk.rule(x + 1) - 1, backend="eager")(x)
        print(disabled.tolist(), traced.tolist(), chunk.seen)
    """, DISABLED)
    assert out == "[3.0, 3.0] [3.0, 3.0] [False, True]"


def test_a_failed_import_restores_torch_disable(tmp_path):
    files = {**DISABLED, "fla/ops/gated_delta_rule/chunk.py": (
        "import torch\n@torch.compiler.disable\ndef rule(x):\n    return x\n"
        "raise RuntimeError('broken')\n")}
    out = _run(tmp_path, """
        import sys, torch
        real = torch.compiler.disable
        from minisgl.linear_attn.fla_import import chunk_gated_delta_rule
        try:
            chunk_gated_delta_rule()
        except RuntimeError as e:
            print(e, torch.compiler.disable is real, 'torch._dynamo' in sys.modules)
    """, files)
    assert out == "broken True False"


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core not installed")
def test_the_real_fla_rule_is_the_packages_own():
    code = """
        import sys, torch
        real = torch.compiler.disable
        from minisgl.linear_attn.fla_import import chunk_gated_delta_rule
        rule = chunk_gated_delta_rule()
        bare = 'fla.modules.norm.fused_norm_gate' not in sys.modules
        print(bare, 'torch._dynamo' in sys.modules, torch.compiler.disable is real)
        from fla.ops import chunk_gated_delta_rule as whole
        print(rule is whole, rule._torchdynamo_disable, 'torch._dynamo' in sys.modules)
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "True", "True", "True", "True"]
