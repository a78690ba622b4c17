from .launch.args import ServerAddrs, ServerConfig, parse_args
from .launch.serve import launch_server

__all__ = ["ServerAddrs", "ServerConfig", "launch_server", "parse_args"]
