"""``python -m minisgl --shell``: chat in the terminal with the same stack as the server.

The server runs on a free local port in a background thread; the shell is an OpenAI client of it,
so it exercises exactly what HTTP users get. ``/reset`` clears the history, ``/exit`` or Ctrl-D quits.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time

from .args import ServerConfig
from .launch import LaunchError, _free_port, make_http_server, start_stack

HELP = "Type a message. /reset clears the history, /exit (or Ctrl-D) quits."


def run_shell(config: ServerConfig) -> int:
    config = dataclasses.replace(config, host="127.0.0.1", port=_free_port())
    try:
        group, app = start_stack(config)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    server = make_http_server(config, app)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        _repl(config)
    finally:
        server.should_exit = True
        thread.join(10)
        group.shutdown()
    return 0


def _repl(config: ServerConfig) -> None:
    from openai import OpenAI
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import InMemoryHistory

    client = OpenAI(base_url=f"http://127.0.0.1:{config.port}/v1", api_key=config.api_key or "none")
    session: PromptSession = PromptSession(history=InMemoryHistory())
    history: list[dict] = []
    print(f"minisgl shell: {config.model_name}. {HELP}")
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
        if line == "/reset":
            history.clear()
            print("(history cleared)")
            continue
        history.append({"role": "user", "content": line})
        history.append({"role": "assistant", "content": _stream_answer(client, config, history)})


def _stream_answer(client, config: ServerConfig, history: list[dict]) -> str:
    parts: list[str] = []
    try:
        stream = client.chat.completions.create(
            model=config.model_name, messages=history, stream=True, max_tokens=512
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                print(parts[-1], end="", flush=True)
    except KeyboardInterrupt:
        print(" [interrupted]", end="")
    except Exception as e:  # a server error must not end the session
        print(f"[error: {e}]", end="")
    print()
    return "".join(parts)
