"""The server options that name an entry of a registry in this package (reasoning and tool-call
parsers, the source of sampling defaults), checked against it. ``ServerConfig`` sits below
``server/openai/`` and cannot look them up itself; the command line and the app call this."""

from __future__ import annotations

from minisgl.server.config import ServerConfig
from minisgl.server.openai.generation_defaults import check_choice
from minisgl.server.openai.reasoning import PARSERS
from minisgl.server.openai.tools import check_parser


def check_options(config: ServerConfig) -> None:
    """A ``ValueError`` naming the field, as ``ServerConfig`` raises for the others."""
    if config.reasoning_parser not in PARSERS:
        raise ValueError(f"reasoning_parser: must be one of {', '.join(PARSERS)}, "
                         f"got {config.reasoning_parser!r}")
    check_parser(config.tool_call_parser)
    check_choice(config.generation_config)
