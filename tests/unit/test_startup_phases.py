"""Start-up timing: the phases a process logs, counted from the launch that
``python -m minisgl`` stamps into the environment of every process it starts."""

from __future__ import annotations

import os
import time

import pytest

from minisgl.env import LAUNCHED_AT
from minisgl.utils.startup import Phases, since_launch


def test_phases_count_from_the_launch(monkeypatch):
    monkeypatch.setenv(LAUNCHED_AT.name, repr(time.time() - 2.0))
    launched = since_launch()
    assert launched is not None and 2.0 <= launched < 3.0
    phases = Phases(launch="spawned")
    time.sleep(0.05)
    phases.mark("tokenizer")
    names = [part.split(" ")[0] for part in str(phases).split(", ")]
    assert names == ["spawned", "tokenizer"]
    assert str(phases).startswith("spawned 2.")


def test_outside_a_launch_there_is_no_launch_time(monkeypatch):
    monkeypatch.delenv(LAUNCHED_AT.name, raising=False)
    assert since_launch() is None
    phases = Phases(launch="spawned")
    phases.mark("weights")
    assert str(phases).startswith("weights ")


def test_the_cli_stamps_the_launch_for_its_children(monkeypatch):
    """``python -m minisgl`` sets the variable before anything else (a spawned child inherits
    it); a value already set (a parent launcher's) is kept."""
    from minisgl.__main__ import main

    monkeypatch.setattr("minisgl.utils.stacks.enable_stack_dumps", lambda: None)  # no fileno
    monkeypatch.delenv(LAUNCHED_AT.name, raising=False)
    t0 = time.time()
    with pytest.raises(SystemExit):
        main(["--no-such-flag"])
    assert t0 <= float(os.environ[LAUNCHED_AT.name]) <= time.time()
    monkeypatch.setenv(LAUNCHED_AT.name, "12.5")
    with pytest.raises(SystemExit):
        main(["--no-such-flag"])
    assert os.environ[LAUNCHED_AT.name] == "12.5"


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux's /proc")
def test_a_process_knows_its_age():
    """The offline ``LLM`` counts from its process's start: a child started 0.3 s ago says so."""
    import subprocess
    import sys

    code = ("import time; time.sleep(0.3); from minisgl.utils.startup import process_age; "
            "print(process_age())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert 0.3 <= float(out) < 10.0  # its own start-up, the sleep and the import
    phases = Phases(launch="before LLM()", launched=1.5)
    phases.mark("tokenizer")
    assert str(phases).startswith("before LLM() 1.5 s, tokenizer 0.0 s")
