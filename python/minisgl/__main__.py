"""``python -m minisgl``: the OpenAI-compatible server (``--shell`` for a terminal chat);
``python -m minisgl warmup``: fill a kernel cache without serving (``warmup_cli.py``)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minisgl.server.launch.prestart import Prestarted

# runs that start no scheduler of their own: no process is started before their flags are read
_NO_PRESTART = {"--shell", "-h", "--help", "--dp", "--data-parallel-size", "--dp-size"}


def main(argv: list[str] | None = None) -> int:
    import os
    import time

    from minisgl.env import LAUNCHED_AT, set_process_defaults

    os.environ.setdefault(LAUNCHED_AT.name, repr(time.time()))  # before the heavy imports
    set_process_defaults()
    argv = sys.argv[1:] if argv is None else argv
    prestarted: dict[str, Prestarted] = {}
    if argv[:1] != ["warmup"] and not _NO_PRESTART & {a.split("=")[0] for a in argv}:
        from minisgl.server.launch.prestart import prestart

        prestarted = prestart()  # their imports run beside this process's
    try:
        return _main(argv, prestarted)
    finally:
        if prestarted:
            from minisgl.server.launch.prestart import close_unhanded

            close_unhanded(prestarted)  # those not handed their work


def _main(argv: list[str], prestarted: dict[str, Prestarted]) -> int:
    from minisgl.server.launch.args import parse_args
    from minisgl.utils.stacks import enable_stack_dumps

    enable_stack_dumps()  # kill -USR1 PID: every thread's stack (any minisgl process)
    if argv[:1] == ["warmup"]:  # fill a kernel cache without serving
        from minisgl.server.launch.warmup_cli import main as warmup_main

        return warmup_main(argv[1:])
    try:
        config = parse_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if config.log_level is not None:
        from minisgl.utils.logger import set_log_level

        set_log_level(config.log_level)
    if config.shell:
        from minisgl.server.launch.shell import run_shell

        return run_shell(config)
    if config.dp > 1:
        from minisgl.server.launch.dp_launch import launch_dp

        return launch_dp(config)
    from minisgl.server.launch.serve import launch_server

    return launch_server(config, prestarted)


if __name__ == "__main__":
    sys.exit(main())
