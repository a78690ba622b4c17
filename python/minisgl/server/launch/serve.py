"""Start the server's processes, serve HTTP until a signal, then take everything down.

Start-up is acknowledged: every child sends ``("ok", info)`` or ``("error", line)`` on a pipe; one
error (or a child dying) stops the launch with that line and no process left behind. While serving,
a monitor thread watches the children: if one dies, the server turns unhealthy and every in-flight
request fails at once.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from minisgl.server.config import ServerConfig
from minisgl.utils import init_logger
from minisgl.utils.heap import freeze_heap
from minisgl.utils.mp import ServerAddrs, make_runtime_dir, remove_runtime_dir
from minisgl.utils.startup import since_launch

from .checks import LaunchError, check_port_free, check_ssl_files, free_port, read_chat_template
from .http_server import make_http_server
from .prestart import Prestarted, close_unhanded

logger = init_logger(__name__)

_START_TIMEOUT_S = 900.0


@dataclass
class Child:
    name: str
    process: BaseProcess
    ready: Connection


class ProcessGroup:
    """The children of one launch, their runtime directory, and their orderly shutdown."""

    def __init__(self, config: ServerConfig, model_path: str,
                 prestarted: dict[str, Prestarted] | None = None) -> None:
        self.config, self.model_path = config, model_path
        # the children started before the flags were read, by role (``prestart.py``): the first
        # local scheduler rank and the detokenizer take them
        self.prestarted = dict(prestarted or {})
        self.tokenizer_path = config.tokenizer or model_path
        self.runtime_dir = make_runtime_dir()
        self.addrs = ServerAddrs.create(self.runtime_dir)
        self.children: list[Child] = []
        self.info: dict = {}
        self.stopping = False
        self.failed = False  # a child died while serving

    def _spawn(self, name: str, target, *args, **kwargs) -> None:
        """Start ``target(*args, ready=pipe, **kwargs)`` in a child; it reports on the pipe."""
        role = "scheduler" if name.startswith("scheduler") else name
        if (prestarted := self.prestarted.pop(role, None)) is not None:
            ready = prestarted.hand(target, *args, **kwargs)
            if ready is not None:
                self.children.append(Child(name, prestarted.process, ready))
                return
        ctx = mp.get_context("spawn")
        parent_end, child_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=target, args=args, kwargs={**kwargs, "ready": child_end},
                           name=name, daemon=True)
        proc.start()
        child_end.close()
        self.children.append(Child(name, proc, parent_end))

    def start(self, wait: bool = True) -> None:
        """Start every child; ``wait``: until each reports (else call ``wait_ready``)."""
        from minisgl.distributed import DistributedInfo
        from minisgl.scheduler.io import run_scheduler_process
        from minisgl.tokenizer.server import tokenize_worker

        cfg, addrs = self.config, self.addrs
        dist_addr = cfg.dist_init_addr or f"127.0.0.1:{free_port()}"
        per_node = cfg.tp // cfg.nnodes
        for local in range(per_node):
            rank = cfg.node_rank * per_node + local
            self._spawn("scheduler" if rank == 0 else f"scheduler-{rank}", _worker,
                        run_scheduler_process, cfg.engine, self.model_path, addrs.backend,
                        addrs.detokenizer, log_stats_interval=cfg.log_stats_interval,
                        watchdog_timeout=cfg.watchdog_timeout,
                        tp=DistributedInfo(rank, cfg.tp), dist_init_addr=dist_addr,
                        local_index=local)
        if cfg.node_rank > 0:  # only node 0 talks to clients
            close_unhanded(self.prestarted)
            if wait:
                self.wait_ready()
            return
        tokenizer = {"revision": cfg.revision if cfg.tokenizer else None,
                     "chat_template": read_chat_template(cfg.chat_template),
                     "model_dir": self.model_path, "media": cfg.media,
                     "cache_dir": cfg.engine.tokenizer_cache_dir()}
        self._spawn("detokenizer", _worker, tokenize_worker, self.tokenizer_path, addrs,
                    tokenize=cfg.num_tokenizer == 0, detokenize=True, **tokenizer)
        for i in range(cfg.num_tokenizer):
            self._spawn(f"tokenizer-{i}", _worker, tokenize_worker, self.tokenizer_path, addrs,
                        tokenize=True, detokenize=False, **tokenizer)
        close_unhanded(self.prestarted)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        pending = list(self.children)
        while pending:
            for child in list(pending):
                if child.ready.poll(0.05):
                    try:
                        status, payload = child.ready.recv()
                    except EOFError:
                        status, payload = "error", f"{child.name} exited during start-up"
                    if status != "ok":
                        raise LaunchError(payload)
                    self.info[child.name] = payload
                    pending.remove(child)
                elif not child.process.is_alive():
                    raise LaunchError(f"{child.name} exited during start-up "
                                      f"(exit code {child.process.exitcode})")
            if time.monotonic() > deadline:
                raise LaunchError(f"start-up timed out waiting for {pending[0].name}")

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if not c.process.is_alive()), None)

    def shutdown(self, timeout: float = 5.0) -> None:
        self.stopping = True
        for child in self.children:
            if child.process.is_alive():
                child.process.terminate()
        deadline = time.monotonic() + timeout
        for child in self.children:
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                child.process.kill()
                child.process.join(2.0)
        remove_runtime_dir(self.runtime_dir)


def _worker(target, *args, **kwargs) -> None:
    """Children ignore Ctrl-C (the terminal sends it to the whole group): the launcher decides.
    ``kill -USR1`` prints a child's stacks."""
    import signal

    from minisgl.utils.stacks import enable_stack_dumps

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    enable_stack_dumps()
    _thread_lock_for_progress_bars()
    target(*args, **kwargs)


def _thread_lock_for_progress_bars() -> None:
    """tqdm's default lock is a multiprocessing semaphore, registered with the launcher's resource
    tracker; a child killed with ``kill -9`` never unregisters it, and the launcher then warns of a
    leaked semaphore at exit. A child's progress bars (weight loading) need only a thread lock."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _monitor(group: ProcessGroup, frontend_ref) -> None:
    """Turn the server unhealthy and fail in-flight requests as soon as a child dies.

    A single-machine server stays up (unhealthy) for inspection; one spread over several machines
    cannot recover a lost rank, so it then shuts down.
    """
    while not group.stopping:
        dead = group.dead_child()
        frontend = frontend_ref()
        if dead is not None and frontend is not None:
            message = f"the {dead.name} process died (exit code {dead.process.exitcode})"
            logger.error("%s; the server is unhealthy", message)
            frontend.workers_lost_threadsafe(message)
            if group.config.nnodes > 1:
                group.failed = True
                time.sleep(1.0)  # let the failed requests' replies go out
                os.kill(os.getpid(), signal.SIGTERM)
            return
        time.sleep(0.2)


def start_stack(config: ServerConfig, prestarted: dict[str, Prestarted] | None = None):
    """Start every child (those of ``prestarted``'s roles in its processes) and build the
    app: ``(group, app)``; raise ``LaunchError`` on failure."""
    from minisgl.models.weight import resolve_model_path

    group: ProcessGroup | None = None
    try:
        check_port_free(config.host, config.port)
        check_ssl_files(config)
        model_path = resolve_model_path(config.model, config.revision)
        from minisgl.server.openai.bodies import TokenTexts

        # the API process's tokenizer first, on a thread: transformers' import is the longest of
        # this process's start (the port opens once it is loaded), and its file reads leave the
        # interpreter to the imports below meanwhile
        tokens = TokenTexts(config.tokenizer or model_path,
                            config.engine.tokenizer_cache_dir()).prefetch()
        group = ProcessGroup(config, model_path, prestarted)
        group.start(wait=False)
        # while the children start: the app's imports
        from minisgl.server.app.api_server import create_app
        from minisgl.server.openai.frontend import FrontendManager

        group.wait_ready()
    except (LaunchError, FileNotFoundError, ValueError, RuntimeError) as e:
        if group is not None:
            group.shutdown()
        raise LaunchError(str(e)) from None
    processes = {c.name: c.process.pid for c in group.children}
    app = create_app(config, lambda: FrontendManager(group.addrs), model_path,
                     {**group.info["scheduler"], "processes": processes}, tokens)
    monitor = threading.Thread(
        target=_monitor, args=(group, lambda: getattr(app.state, "frontend", None)), daemon=True
    )
    monitor.start()
    return group, app


def launch_server(config: ServerConfig, prestarted: dict[str, Prestarted] | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; return the process exit code. ``prestarted``: the
    processes started before the flags were read (``prestart.py``), by the role they take."""
    if config.node_rank > 0:
        return _serve_worker_node(config, prestarted)
    if config.port == 0:  # chosen here, so that the log and the listening socket agree
        config = dataclasses.replace(config, port=free_port())
    try:
        group, app = start_stack(config, prestarted)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    scheme = "https" if config.ssl_certfile else "http"
    launched = since_launch()
    logger.info("serving %s on %s://%s:%d%s", config.model_name, scheme, config.host, config.port,
                "" if launched is None else f" ({launched:.1f} s after the launch)")
    freeze_heap()
    try:
        make_http_server(config, app).run()
    finally:
        group.shutdown()
    return 1 if group.failed else 0


def _serve_worker_node(config: ServerConfig,
                       prestarted: dict[str, Prestarted] | None = None) -> int:
    """A node other than 0 runs only its scheduler ranks, until a signal or one of them exits."""
    from minisgl.models.weight import resolve_model_path

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    group: ProcessGroup | None = None
    try:
        group = ProcessGroup(config, resolve_model_path(config.model, config.revision),
                             prestarted)
        group.start()
        logger.info("node %d: %d scheduler ranks ready", config.node_rank, len(group.children))
        while not stop.wait(0.2):
            dead = group.dead_child()
            if dead is not None:
                logger.error("%s exited (code %s): stopping this node", dead.name,
                             dead.process.exitcode)
                return 1
        return 0
    except (LaunchError, FileNotFoundError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if group is not None:
            group.shutdown()
