"""Runtime directories: a launch killed with ``kill -9`` leaves its socket directory behind; the
next launch removes it, and never one of a process that is still alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from minisgl.utils.runtime_dir import PREFIX, make_runtime_dir, remove_stale_runtime_dirs

LAUNCHER = """
import sys, time, zmq
from minisgl.utils.mp import ipc_address, make_runtime_dir
path = make_runtime_dir()
sockets = [zmq.Context.instance().socket(zmq.PULL) for _ in range(4)]
for i, s in enumerate(sockets):
    s.bind(ipc_address(path, f"s{i}"))
print(path, flush=True)
time.sleep(600)
"""


def test_killed_launchers_directory_is_removed_at_the_next_start():
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        left = proc.stdout.readline().strip()
        assert len(os.listdir(left)) == 4  # its socket files
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert os.path.isdir(left)  # kill -9: nothing could clean up
    mine = make_runtime_dir()
    try:
        assert not os.path.exists(left)
        assert os.path.basename(mine).startswith(f"{PREFIX}{os.getpid()}-")
        assert remove_stale_runtime_dirs() == []  # its own launcher is alive
        assert os.path.isdir(mine)
    finally:
        os.rmdir(mine)


def test_only_dead_launchers_directories_go(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(30)
    own = make_runtime_dir()
    own_name = os.path.basename(own)
    os.rmdir(own)
    pid, started = own_name.split("-")[1:3]
    names = {
        "dead": f"{PREFIX}{dead.pid}-{started}-abc",
        "alive": own_name,
        "reused pid": f"{PREFIX}{pid}-{int(started) + 1}-abc",  # pid alive, other process
        "old format": f"{PREFIX}zq8x1",
        "not minisgl": f"other-{dead.pid}-1-abc",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
    (tmp_path / f"{PREFIX}{dead.pid}-1-file").write_text("a file, not a directory")
    removed = {os.path.basename(p) for p in remove_stale_runtime_dirs(str(tmp_path))}
    assert removed == {names["dead"], names["reused pid"]}
    assert {p.name for p in tmp_path.iterdir()} == {
        names["alive"], names["old format"], names["not minisgl"], f"{PREFIX}{dead.pid}-1-file"}
