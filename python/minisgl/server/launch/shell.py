"""``python -m minisgl --shell``: chat in the terminal with the same stack as the server.

The server runs on a free local port in a background thread; the shell is an OpenAI client of it,
so it exercises exactly what HTTP users get. The terminal shows only the conversation: every
process's log (the scheduler's stats, request lines, warnings) goes to a log file, because the
children write to the stderr they inherit and would otherwise print over the prompt.
``/set NAME VALUE`` changes the sampling, ``/reset`` clears the history, ``/exit`` or Ctrl-D quits.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from minisgl.server.config import ServerConfig

from .checks import LaunchError, free_port
from .serve import make_http_server, start_stack

HELP = ("Type a message. /set NAME VALUE changes the sampling (/set alone shows it), /reset clears "
        "the history, /help shows this, /exit (or Ctrl-D) quits; Ctrl-C stops an answer.")


@dataclass
class ChatSettings:
    """The shell's sampling: chat-friendly defaults rather than the server's (temperature 1)."""

    temperature: float = 0.7
    top_p: float = 0.9
    max_tokens: int = 512

    def set(self, name: str, text: str) -> str:
        """Change one setting from its text; the new setting, or ``ValueError`` saying why not."""
        limits = {"temperature": (float, 0.0, 2.0), "top_p": (float, 1e-9, 1.0),
                  "max_tokens": (int, 1, 1 << 20)}
        if name not in limits:
            raise ValueError(f"unknown setting {name!r}; settings: {', '.join(limits)}")
        kind, low, high = limits[name]
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"{name}: {text!r} is not a number") from None
        if not low <= value <= high:
            raise ValueError(f"{name}: must be in [{low:g}, {high:g}], got {text}")
        setattr(self, name, value)
        return f"{name} = {value}"

    def show(self) -> str:
        return ", ".join(f"{k} = {v}" for k, v in dataclasses.asdict(self).items())


def run_shell(config: ServerConfig) -> int:
    config = dataclasses.replace(config, host="127.0.0.1", port=free_port(), ssl_keyfile=None,
                                 ssl_certfile=None)
    log_path, terminal = _logs_to_file()
    print(f"loading {config.model_name} (the log: {log_path}) ...", file=terminal, flush=True)
    try:
        group, app = start_stack(config)
    except LaunchError as e:
        print(f"error: {e} (log: {log_path})", file=terminal)
        return 1
    server = make_http_server(config, app)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        _repl(config, log_path)
    finally:
        server.should_exit = True
        thread.join(10)
        group.shutdown()
    return 0


def _logs_to_file() -> tuple[str, TextIO]:
    """Point file descriptor 2 (this process's and every child's stderr) at the shell's log file;
    return its path and a stream to the terminal's stderr, for errors the user must see."""
    from minisgl.models.default_model import cache_root

    os.makedirs(cache_root(), exist_ok=True)
    path = os.path.join(cache_root(), "shell.log")
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    sys.stderr.flush()
    with open(path, "a") as log:
        os.dup2(log.fileno(), 2)
    return path, terminal


def _repl(config: ServerConfig, log_path: str) -> None:
    from openai import OpenAI
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import InMemoryHistory

    client = OpenAI(base_url=f"http://127.0.0.1:{config.port}/v1", api_key=config.api_key or "none")
    session: PromptSession = PromptSession(history=InMemoryHistory())
    history: list[dict] = []
    settings = ChatSettings()
    print(f"minisgl shell: {config.model_name} (server log: {log_path}). {HELP}")
    while True:
        try:
            line = session.prompt("> ").strip()
        except KeyboardInterrupt:
            continue
        except EOFError:
            break
        if not line:
            continue
        if line == "/exit":
            break
        if line == "/help":
            print(HELP)
            continue
        if line == "/reset":
            history.clear()
            print("(history cleared)")
            continue
        if line.split()[0] == "/set":
            print(f"({_set(settings, line.split()[1:])})")
            continue
        if line.startswith("/") and line.split()[0] not in ("/exit", "/reset", "/help"):
            print(f"(unknown command {line.split()[0]}; {HELP})")
            continue
        with _KeysDuringAnswer() as keys:
            answer = _stream_answer(client, config,
                                    [*history, {"role": "user", "content": line}], settings, keys)
        if keys.eof:  # Ctrl-D while it streamed: stop there and quit, as Ctrl-D at the prompt does
            break
        if answer is None:  # stopped with Ctrl-C: the exchange is not kept
            continue
        history += [{"role": "user", "content": line}, {"role": "assistant", "content": answer}]


def _set(settings: ChatSettings, words: list[str]) -> str:
    if not words:
        return settings.show()
    if len(words) != 2:
        return "usage: /set NAME VALUE, e.g. /set temperature 0"
    try:
        return settings.set(*words)
    except ValueError as e:
        return str(e)


class _KeysDuringAnswer:
    """Ctrl-D typed while an answer streams. The terminal is in cbreak mode meanwhile (Ctrl-D
    arrives as a byte instead of being swallowed by the line discipline before the next prompt;
    Ctrl-C still raises ``KeyboardInterrupt``); other keys typed then are dropped. Not a
    terminal (a pipe): nothing is read."""

    def __init__(self) -> None:
        self.eof = False
        self._saved = None

    def __enter__(self) -> _KeysDuringAnswer:
        if sys.stdin.isatty():
            import termios
            import tty

            self._saved = termios.tcgetattr(sys.stdin)
            tty.setcbreak(sys.stdin)
        return self

    def poll(self) -> bool:
        """True once Ctrl-D was typed."""
        if self._saved is not None and not self.eof:
            import select

            while select.select([sys.stdin], [], [], 0)[0]:
                if os.read(sys.stdin.fileno(), 1) in (b"\x04", b""):
                    self.eof = True
                    break
        return self.eof

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            import termios

            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, self._saved)


def _stream_answer(client, config: ServerConfig, history: list[dict],
                   settings: ChatSettings, keys: _KeysDuringAnswer) -> str | None:
    """The answer as it streams; None when Ctrl-C (or Ctrl-D, ``keys``) stopped it (the request
    is aborted: closing the stream disconnects, and the server frees its KV cache)."""
    parts: list[str] = []
    try:
        stream = client.chat.completions.create(
            model=config.model_name, messages=history, stream=True, **dataclasses.asdict(settings)
        )
        for chunk in stream:
            if keys.poll():
                stream.close()
                print(" [stopped]")
                return None
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                print(parts[-1], end="", flush=True)
    except KeyboardInterrupt:
        print(" [stopped; not kept in the history]")
        return None
    except Exception as e:  # a server error must not end the session
        print(f"[error: {e}]")
        return None
    print()
    return "".join(parts)
