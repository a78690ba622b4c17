"""``--dp N``: N whole servers (replicas) behind SGLang Model Gateway, as one service.

Replica i serves on 127.0.0.1:(port+1+i) with ``tp`` GPUs of its own (a slice of
``CUDA_VISIBLE_DEVICES``); the router serves the public ``host:port`` and exports its Prometheus
metrics on 127.0.0.1:(port+1+N). Every child runs in a process group of its own, its output lines
prefixed with its name (``[dp0]``, ``[router]``), so that a replica's log and ``/metrics`` stay
its own.

Start-up: every replica must answer ``/health`` (which a minisgl server does only once all its
processes are up) before the router starts; the launch fails, leaving nothing behind, if one
cannot. While serving, a replica that dies is reported here, and the router's health checks (and
its refused connections) take it out of rotation while the others keep serving; the router dying
ends the service. SIGTERM/SIGINT: the router drains first (it stops taking requests and finishes
the ones in flight), then the replicas stop, then whatever is left of each process group is killed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from minisgl.env import API_KEY
from minisgl.server.config import ServerConfig
from minisgl.utils import init_logger

from .checks import LaunchError, check_port_free
from .dp_children import ROUTER_MODULE, replica_command, replica_config_json, router_command

logger = init_logger(__name__)

_START_TIMEOUT_S = 900.0
_POLL_S = 0.5
_KILL_GRACE_S = 5.0  # after the drain, for a process group to exit before it is killed


@dataclass
class Child:
    """One process group started by the launcher, with the thread that prefixes its output."""

    name: str
    proc: subprocess.Popen
    url: str = ""
    reported: bool = False  # its death has been logged
    pump: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.pump = threading.Thread(target=_prefix_lines, args=(self.proc, self.name),
                                     daemon=True)
        self.pump.start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


def _prefix_lines(proc: subprocess.Popen, name: str) -> None:
    assert proc.stdout is not None
    for line in iter(proc.stdout.readline, b""):
        sys.stderr.write(f"[{name}] {line.decode(errors='replace')}")
    proc.stdout.close()


def gpu_slices(config: ServerConfig) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` of each replica (None on CPU): consecutive groups of ``tp``."""
    device = config.engine.device
    if device == "cpu":
        return [None] * config.dp
    if device.startswith("cuda:"):
        raise LaunchError("device: with --dp give --device cuda; CUDA_VISIBLE_DEVICES picks the "
                          "GPUs, which the replicas share out in groups of --tp")
    import torch

    if not torch.cuda.is_available():
        if device == "auto":
            return [None] * config.dp
        raise LaunchError(f"device: {device!r} asked for, but no GPU is visible")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = ([d.strip() for d in visible.split(",") if d.strip()] if visible is not None
           else [str(i) for i in range(torch.cuda.device_count())])
    need = config.dp * config.tp
    if need > len(ids):
        raise LaunchError(f"dp: {config.dp} replicas x tp {config.tp} need {need} GPUs, "
                          f"{len(ids)} are visible")
    return [",".join(ids[i * config.tp:(i + 1) * config.tp]) for i in range(config.dp)]


class DataParallelService:
    """The replicas and the router of one ``--dp`` launch."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.replicas: list[Child] = []
        self.router: Child | None = None
        self.stop = threading.Event()

    def ports(self) -> tuple[list[int], int]:
        first = self.config.port + 1
        return list(range(first, first + self.config.dp)), first + self.config.dp

    def start(self) -> None:
        if importlib.util.find_spec(ROUTER_MODULE) is None:
            raise LaunchError("dp: the router is not installed: pip install 'minisgl[router]' "
                              "(SGLang Model Gateway, the smg package)")
        replica_ports, metrics_port = self.ports()
        for host, port in [(self.config.host, self.config.port),
                           *[("127.0.0.1", p) for p in (*replica_ports, metrics_port)]]:
            check_port_free(host, port)
        for i, (port, gpus) in enumerate(zip(replica_ports, gpu_slices(self.config))):
            env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else {})}
            child = self._spawn(f"dp{i}", replica_command(), env,
                                replica_config_json(self.config, port))
            child.url = f"http://127.0.0.1:{port}"
            self.replicas.append(child)
        for child in self.replicas:
            self._wait_healthy(child)
        logger.info("%d replicas ready: %s", len(self.replicas),
                    " ".join(c.url for c in self.replicas))
        cmd = router_command(self.config, [c.url for c in self.replicas], metrics_port)
        # plain log lines where they do not go to a terminal (the router colours them otherwise)
        env = {**os.environ, **({} if sys.stderr.isatty() else {"NO_COLOR": "1"})}
        self.router = self._spawn("router", cmd, env)
        self.router.url = _router_url(self.config)
        self._wait_router()

    def _spawn(self, name: str, cmd: list[str], env: dict, stdin: str | None = None) -> Child:
        if self.config.api_key is not None:
            env[API_KEY.name] = self.config.api_key
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        assert proc.stdin is not None
        proc.stdin.write((stdin or "").encode())
        proc.stdin.close()
        return Child(name, proc)

    def _wait_healthy(self, child: Child) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _get_ok(f"{child.url}/health", None):
            if not child.alive:
                raise LaunchError(f"replica {child.name} exited during start-up "
                                  f"(exit code {child.proc.returncode}); its log is above")
            if self.stop.is_set() or time.monotonic() > deadline:
                raise LaunchError(f"replica {child.name} did not become healthy")
            time.sleep(_POLL_S)

    def _wait_router(self) -> None:
        """Until the router answers and has every replica in rotation."""
        assert self.router is not None
        deadline = time.monotonic() + 120.0
        key = self.config.api_key
        while True:
            workers = _get_json(f"{self.router.url}/workers", key)
            healthy = [w for w in (workers or {}).get("workers", [])
                       if w.get("is_healthy", w.get("healthy"))]
            if len(healthy) == len(self.replicas):
                logger.info("router (%s) serving on %s", self.config.router_policy,
                            self.router.url)
                return
            if not self.router.alive:
                raise LaunchError(f"the router exited during start-up (exit code "
                                  f"{self.router.proc.returncode}); its log is above")
            if self.stop.is_set() or time.monotonic() > deadline:
                raise LaunchError("the router did not take every replica into rotation")
            time.sleep(_POLL_S)

    def watch(self) -> int:
        """Until a signal (0) or the router's death (1); replicas that die are reported."""
        assert self.router is not None
        while not self.stop.wait(_POLL_S):
            for child in self.replicas:
                if not child.alive and not child.reported:
                    child.reported = True
                    alive = sum(c.alive for c in self.replicas)
                    logger.error("replica %s (%s) exited with code %s; the router takes it out "
                                 "of rotation, %d of %d replicas keep serving", child.name,
                                 child.url, child.proc.returncode, alive, len(self.replicas))
            if not self.router.alive:
                logger.error("the router exited (code %s): stopping the replicas",
                             self.router.proc.returncode)
                return 1
        return 0

    def shutdown(self) -> None:
        """Router first (it drains), then the replicas (they drain what is left), then kill."""
        drain = self.config.shutdown_timeout + _KILL_GRACE_S
        for group in ([self.router] if self.router else [], self.replicas):
            for child in group:
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + drain
            for child in group:
                try:
                    child.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.warning("%s did not exit in %.0fs: killing it", child.name, drain)
        for child in [*self.replicas, *([self.router] if self.router else [])]:
            child.signal(signal.SIGKILL)  # whatever is left of its process group
            if child.alive:
                child.proc.wait()
            child.pump.join(2.0)


def _router_url(config: ServerConfig) -> str:
    """The router's URL as this machine reaches it (0.0.0.0 / :: are not addresses to call)."""
    scheme = "https" if config.ssl_certfile else "http"
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    return f"{scheme}://{host}:{config.port}"


def _request(url: str, key: str | None) -> urllib.request.Request:
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})


def _get_ok(url: str, key: str | None) -> bool:
    try:
        with urllib.request.urlopen(_request(url, key), timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _get_json(url: str, key: str | None) -> dict | None:
    import ssl

    context = ssl._create_unverified_context()  # our own router, possibly a self-signed cert
    try:
        with urllib.request.urlopen(_request(url, key), timeout=2, context=context) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def launch_dp(config: ServerConfig) -> int:
    """Run the replicas and the router until SIGINT/SIGTERM; return the process exit code."""
    service = DataParallelService(config)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: service.stop.set())
    try:
        service.start()
        return service.watch()
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        service.shutdown()
