"""The two kinds of process that ``--dp N`` starts, and their command lines.

- a replica: a whole minisgl server (``launch_server``) on 127.0.0.1, its configuration read as
  JSON from stdin (the API key comes in the environment: neither is visible in ``ps``);
- the router: SGLang Model Gateway (``smg``, the ``minisgl[router]`` extra) in front of the
  replicas, started through its Python entry point so that the API key, too, travels in the
  environment rather than on its command line.

Run as ``python -m minisgl.server.launch.dp_children replica|router [router flags]``.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from minisgl.env import API_KEY
from minisgl.llm.config import EngineOptions
from minisgl.server.config import ServerConfig

ROUTER_MODULE = "smg"
# seconds between the router's health probes of each replica: with two failed probes in a row a
# dead replica leaves the rotation within ~10 s (its refused connections take it out sooner)
HEALTH_INTERVAL_S = 5
_SMG_LOG_LEVELS = {"debug": "debug", "info": "info", "warning": "warn", "error": "error",
                   "critical": "error"}


def replica_config_json(config: ServerConfig, port: int) -> str:
    """One replica's configuration: the launch's, on its own local port, without the key."""
    replica = dataclasses.replace(config, dp=1, host="127.0.0.1", port=port, api_key=None,
                                  ssl_keyfile=None, ssl_certfile=None, allowed_origins=())
    return json.dumps(dataclasses.asdict(replica))


def replica_command() -> list[str]:
    return [sys.executable, "-m", "minisgl.server.launch.dp_children", "replica"]


def router_command(config: ServerConfig, urls: list[str], metrics_port: int) -> list[str]:
    """SGLang Model Gateway on the public address, with the chosen policy, in front of ``urls``."""
    cmd = [sys.executable, "-m", "minisgl.server.launch.dp_children", "router",
           "--host", config.host, "--port", str(config.port), "--worker-urls", *urls,
           "--policy", config.router_policy,
           "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
           "--health-failure-threshold", "2",
           "--shutdown-grace-period-secs", str(max(1, round(config.shutdown_timeout))),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
           "--max-payload-size", str(config.max_body_bytes),
           # the replicas tokenize; the router routes on text and needs no tokenizer of its own
           "--disable-tokenizer-autoload"]
    if config.log_level is not None:
        cmd += ["--log-level", _SMG_LOG_LEVELS[config.log_level.lower()]]
    if config.ssl_certfile is not None:
        cmd += ["--tls-cert-path", config.ssl_certfile, "--tls-key-path", config.ssl_keyfile]
    if config.allowed_origins:
        cmd += ["--cors-allowed-origins", *config.allowed_origins]
    return cmd


def _die_with_launcher() -> None:
    """SIGTERM this process when the launcher dies, even by SIGKILL: a replica or router runs in
    a process group of its own, which nothing else would ever stop (Linux; elsewhere a no-op)."""
    import ctypes
    import os
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher died before the line above
        sys.exit(1)


def _replica_main() -> int:
    from minisgl.env import set_process_defaults
    from minisgl.server.launch.serve import launch_server

    fields = json.loads(sys.stdin.read())
    engine = EngineOptions(**fields.pop("engine"))
    fields["allowed_origins"] = tuple(fields["allowed_origins"])
    config = ServerConfig(engine=engine, **{**fields, "api_key": API_KEY.get() or None})
    set_process_defaults()
    if config.log_level is not None:
        from minisgl.utils.logger import set_log_level

        set_log_level(config.log_level)
    return launch_server(config)


def _router_main(argv: list[str]) -> int:
    """SGLang Model Gateway's own launcher; the key (checked on clients, sent to the replicas)
    comes from the environment."""
    from smg.launch_router import launch_router, parse_router_args

    args = parse_router_args(argv)
    args.api_key = API_KEY.get() or None
    launch_router(args)
    return 0


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    _die_with_launcher()
    if role == "replica":
        sys.exit(_replica_main())
    if role == "router":
        sys.exit(_router_main(sys.argv[2:]))
    sys.exit("usage: python -m minisgl.server.launch.dp_children replica|router [router flags]")
