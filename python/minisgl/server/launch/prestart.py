"""The children a launch starts before it reads its flags.

A server's start waits on its scheduler and its tokenizer worker, and the first seconds of each
are imports (torch and the engine; transformers' tokenizer base for the tokenizer): on a cold
machine as long as the launcher's own, which it needs to read its flags (they name the engine's
options). Spawned after them, each child paid both in turn. ``prestart()`` spawns one process a
role (``ROLES``) first thing: each imports its role's modules while the launcher parses, then
waits on its pipe for its work (``hand``: what ``ProcessGroup`` would have spawned for that
role), for ``close`` (the run is not a server, a flag was wrong, or the launch does not start
that role), or for the launcher's end (the end of its pipe). The pipe then serves as the child's
ready pipe.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
from multiprocessing.connection import Connection

# the children every server launch starts, and what each imports while it waits: the first
# scheduler rank, and the detokenizer (which tokenizes too unless --num-tokenizer is given): what
# every tokenizer class needs, not AutoTokenizer's machinery (torch among it), which a start with
# the tokenizer's class kept in the kernel cache never imports (``utils/tokenizer_class.py``)
_IMPORTS = {
    "scheduler": ("minisgl.scheduler.io",),
    "detokenizer": ("minisgl.tokenizer.server", "transformers.tokenization_utils_base"),
}
ROLES = tuple(_IMPORTS)


class Prestarted:
    """The prestarted process of one role (``process``) and its pipe (``conn``), spawned at
    once."""

    def __init__(self, role: str = "scheduler") -> None:
        if role not in _IMPORTS:
            raise ValueError(f"role: {role!r} is not one of {', '.join(ROLES)}")
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self._env = dict(os.environ)  # what the child started with
        self.process = ctx.Process(target=_wait_for_work, args=(child, role), name=role,
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


def prestart() -> dict[str, Prestarted]:
    """One prestarted process a role, by role."""
    return {role: Prestarted(role) for role in ROLES}


def close_unhanded(prestarted: dict[str, Prestarted]) -> None:
    """Stop every one that was not handed work; the dict is emptied."""
    for p in prestarted.values():
        p.close()
    prestarted.clear()


def _wait_for_work(conn: Connection, role: str) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides (``serve._worker``)
    for module in _IMPORTS[role]:  # the imports, beside the launcher's
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the work imports it again and reports what fails
            break
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
