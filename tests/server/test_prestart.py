"""The processes a launch starts before it reads its flags (``launch/prestart.py``), one a role:
handed its work, each runs it with the environment the launcher set since and answers on its
pipe, its role's imports done; closed unused, or left by its launcher, it ends."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from helpers.prestart_targets import report
from minisgl.env import LOG_LEVEL
from minisgl.server.launch.prestart import ROLES, Prestarted


@pytest.mark.parametrize("role,imported", [
    ("scheduler", "minisgl.scheduler.io"),
    ("detokenizer", "transformers.tokenization_utils_base"),  # every tokenizer class's
])
def test_handed_work_runs_with_the_launchers_environment(monkeypatch, role, imported):
    prestarted = Prestarted(role)
    monkeypatch.setenv("MINISGL_TEST_PRESTART", "set after the start")
    monkeypatch.setenv(LOG_LEVEL.name, "WARNING")  # what --log-level does in the launcher
    ready = prestarted.hand(report, "MINISGL_TEST_PRESTART")
    assert ready is not None and ready.poll(120)
    status, info = ready.recv()
    assert status == "ok" and info["pid"] == prestarted.process.pid
    assert info["value"] == "set after the start" and info["level"] == logging.WARNING
    assert imported in info["modules"]  # its imports ran before the work came
    if role == "detokenizer":  # the tokenizer worker's own too
        assert "minisgl.tokenizer.server" in info["modules"]
    prestarted.close()  # handed: left running, the launch owns it now
    prestarted.process.join(30)
    assert prestarted.process.exitcode == 0


def test_closed_unused_it_stops_at_once():
    prestarted = Prestarted()
    start = time.monotonic()
    prestarted.close()
    assert not prestarted.process.is_alive() and time.monotonic() - start < 5
    assert prestarted.hand(report, "X") is None  # gone: the launch spawns anew


def test_the_group_hands_each_role_to_its_process(tmp_path):
    """The first scheduler rank and the detokenizer go to the prestarted processes of their
    roles; a child of no role (another rank, a tokenizer) is spawned."""
    from minisgl.server.config import ServerConfig
    from minisgl.server.launch.serve import ProcessGroup

    prestarted = {role: Prestarted(role) for role in ROLES}
    group = ProcessGroup(ServerConfig(model=str(tmp_path)), str(tmp_path), prestarted)
    try:
        for name in ("scheduler", "detokenizer", "tokenizer-0"):
            group._spawn(name, report, "X")
        got = {c.name: c.process.pid for c in group.children}
        assert got["scheduler"] == prestarted["scheduler"].process.pid
        assert got["detokenizer"] == prestarted["detokenizer"].process.pid
        assert got["tokenizer-0"] not in {p.process.pid for p in prestarted.values()}
        group.wait_ready()
        assert not group.prestarted  # each taken once
    finally:
        group.shutdown()
    with pytest.raises(ValueError, match="role: 'tokenizer-0' is not one of scheduler"):
        Prestarted("tokenizer-0")


def test_it_ends_with_its_launcher(tmp_path):
    """A launcher killed before it handed anything leaves no process behind."""
    import psutil

    code = ("import sys, time; from minisgl.server.launch.prestart import Prestarted\n"
            "p = Prestarted(); print(p.process.pid, flush=True); time.sleep(60)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                env=env)
    child = int(launcher.stdout.readline())
    time.sleep(1.0)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 60
    while psutil.pid_exists(child) and psutil.Process(child).status() != "zombie":
        assert time.monotonic() < deadline, "the prestarted process outlived its launcher"
        time.sleep(0.2)
