"""Start a real minisgl server (all its processes) for a test, and take it down without
leftovers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    log_path: str
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def openai_client(self):
        """An ``openai`` client of this server that does not retry (a failure shows at once)."""
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the launcher, wait for it, and make sure no descendant survives it."""
        family = self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        finally:
            _, alive = psutil.wait_procs(family, timeout=5)
            for p in alive:
                p.kill()
        assert not alive, f"processes left behind: {[p.pid for p in alive]}"
        return code


def start_server(model_dir: str, *args: str, log_dir: str, timeout: float = 180.0,
                 env: dict | None = None) -> ServerProcess:
    """``env`` adds environment variables; ``--ssl-certfile`` in ``args`` makes it HTTPS."""
    port = free_port()
    log_path = os.path.join(log_dir, f"server-{port}.log")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           **(env or {})}
    cmd = [sys.executable, "-m", "minisgl", "--model", model_dir, "--port", str(port),
           "--device", "cpu", *args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(proc, port, log_path, "https" if "--ssl-certfile" in args else "http")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1, verify=False).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"server did not become healthy:\n{server.log()}")


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def metric(url: str, name: str) -> float | None:
    """The value of the first ``/metrics`` sample whose line starts with ``name`` (labels
    included), or None when there is none."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith(name)]
    return float(lines[0].split()[-1]) if lines else None


def served_model(client) -> str:
    """The id of the one model an ``openai`` client's server serves."""
    return client.models.list().data[0].id
