"""The uvicorn server of the API: its signals start a graceful shutdown that the launcher follows
with stopping the children, and its shutdown deadline ends what still runs with a 503 instead of a
cancelled task (a stream cut off without an error event, a traceback per request in the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading

from minisgl.server.config import ServerConfig
from minisgl.utils import init_logger

logger = init_logger(__name__)
_CUT_GRACE_S = 2.0  # after the shutdown deadline, for the 503s of the requests it cut


def make_http_server(config: ServerConfig, app):
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            app.state.draining = True  # readiness (/health_generate) answers 503 from now on
            super().handle_exit(sig, frame)

        async def _wait_tasks_to_complete(self) -> None:
            """Drain; at the deadline end what still runs with a 503 (an error event in a
            stream), so that every client is told, and give the answers ``_CUT_GRACE_S`` to go
            out before uvicorn cancels what is left."""
            drain = asyncio.ensure_future(super()._wait_tasks_to_complete())
            timeout = config.shutdown_timeout
            await asyncio.wait({drain}, timeout=timeout)
            frontend = getattr(app.state, "frontend", None)
            if not drain.done() and frontend is not None:
                cut = frontend.cut_all("the server is shutting down")
                if cut:
                    logger.warning("shutdown: %d requests still running after %.1fs were cut",
                                   cut, timeout)
            await drain

        @contextlib.contextmanager
        def capture_signals(self):
            """SIGINT/SIGTERM start a graceful shutdown (a second one forces it). Unlike uvicorn's
            own, the signal is not re-raised afterwards: the launcher still has children to stop."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {s: signal.signal(s, self.handle_exit)
                        for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_level="warning",
        timeout_graceful_shutdown=config.shutdown_timeout + _CUT_GRACE_S,  # type: ignore[arg-type]
        ssl_keyfile=config.ssl_keyfile, ssl_certfile=config.ssl_certfile,
    ))
