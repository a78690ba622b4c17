from .args import ServerAddrs, ServerConfig, parse_args
from .launch import launch_server

__all__ = ["ServerAddrs", "ServerConfig", "launch_server", "parse_args"]
