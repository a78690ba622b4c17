"""A scheduler process started before the launcher reads its flags.

A server's start waits on its scheduler, and the scheduler's first seconds are its imports
(torch, the engine): on a cold machine as long as the launcher's own, which it needs to read its
flags (they name the engine's options). Spawned after them, the scheduler paid both in turn.
``Prestarted`` spawns it first thing: it imports while the launcher parses, then waits on its
pipe for its work (``hand``: what ``ProcessGroup`` would have spawned for the first local rank),
for ``close`` (the run is not a server, or a flag was wrong), or for the launcher's end (the end
of its pipe). The pipe then serves as the child's ready pipe.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import Connection


class Prestarted:
    """The prestarted process (``process``) and its pipe (``conn``), spawned at once."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self._env = dict(os.environ)  # what the child started with
        self.process = ctx.Process(target=_wait_for_work, args=(child,), name="scheduler",
                                   daemon=True)
        self.process.start()
        child.close()
        self.handed = False

    def hand(self, target, *args, **kwargs) -> Connection | None:
        """Run ``target(*args, ready=pipe, **kwargs)`` there as a spawned child would (the
        environment the launcher has set since, e.g. ``--log-level``'s, goes with it); the
        pipe, which it answers on, is returned. None if the process is gone (spawn anew)."""
        env = {k: v for k, v in os.environ.items() if self._env.get(k) != v}
        try:
            self.conn.send((target, args, kwargs, env))
        except OSError:
            self.close()
            return None
        self.handed = True
        return self.conn

    def close(self) -> None:
        """Stop it if it was not handed work (its imports need not finish)."""
        if self.handed:
            return
        self.conn.close()
        self.process.terminate()
        self.process.join(5.0)


def _wait_for_work(conn: Connection) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides (``serve._worker``)
    import minisgl.scheduler.io  # noqa: F401 - the imports, beside the launcher's

    try:
        target, args, kwargs, env = conn.recv()
    except (EOFError, OSError):  # closed unused, or the launcher is gone
        return
    os.environ.update(env)
    from minisgl.env import LOG_LEVEL

    if LOG_LEVEL.name in env:
        from minisgl.utils.logger import set_log_level

        set_log_level(env[LOG_LEVEL.name])
    target(*args, ready=conn, **kwargs)
