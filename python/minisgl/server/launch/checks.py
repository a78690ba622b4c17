"""What a launch checks before it starts anything: the flags that name files, and the port."""

from __future__ import annotations

import os
import socket

from minisgl.server.config import ServerConfig


class LaunchError(RuntimeError):
    """A start-up failure, with the one line to show the user."""


def read_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file's content, or the template text itself."""
    if value is None or "{" in value:
        return value
    try:
        with open(os.path.expanduser(value), encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise LaunchError(f"chat_template: {value!r} is neither a readable file ({e.strerror}) "
                          "nor a Jinja template") from None


def check_ssl_files(config: ServerConfig) -> None:
    for name in ("ssl_keyfile", "ssl_certfile"):
        path = getattr(config, name)
        if path is not None and not os.path.isfile(path):
            raise LaunchError(f"{name}: no such file {path!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise LaunchError(f"cannot listen on {host}:{port}: {e.strerror}") from None
