"""The real API app on a real socket, in process, with a stand-in worker thread behind its ZMQ
sockets: what the in-process server tests (``test_api_server.fake_server``, ``test_health``,
``helpers.image_server``) share."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace
from typing import Callable

import uvicorn

from helpers.server_utils import free_port, wait_until
from minisgl.server.app.api_server import create_app
from minisgl.server.config import ServerConfig
from minisgl.server.openai.frontend import FrontendManager
from minisgl.utils.mp import ServerAddrs, make_runtime_dir, remove_runtime_dir


@contextlib.contextmanager
def serve_app(config: ServerConfig, make_worker: Callable[[ServerAddrs], threading.Thread],
              port: int | None = None, **app_options):
    """Yields ``(url, app, addrs, worker)``: the app of ``config`` serving on ``port`` (a free
    one by default), the started thread ``make_worker(addrs)`` behind it (stopped through its
    ``stopping`` event), all in a runtime directory of their own."""
    runtime = make_runtime_dir()
    addrs = ServerAddrs.create(runtime)
    app = create_app(config, lambda: FrontendManager(addrs), server_info={"processes": {}},
                     **app_options)
    port = port or free_port()
    http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    worker = make_worker(addrs)
    worker.start()
    try:
        assert wait_until(lambda: http.started, 30)
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", app=app, addrs=addrs,
                              worker=worker)
    finally:
        http.should_exit = True
        thread.join(10)
        worker.stopping.set()
        worker.join(5)
        remove_runtime_dir(runtime)
