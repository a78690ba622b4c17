"""The server's options, which every layer of ``server/`` reads (the command line that fills them
is ``launch/args.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from minisgl.llm.config import EngineOptions
from minisgl.multimodal.config import MediaOptions


@dataclass(frozen=True)
class ServerConfig:
    """Server options; ``engine`` holds the engine's (shared with the offline ``LLM``)."""

    model: str | None = None
    tokenizer: str | None = None
    revision: str | None = None
    chat_template: str | None = None
    host: str = "127.0.0.1"
    port: int = 1919
    served_model_name: str | None = None
    engine: EngineOptions = field(default_factory=EngineOptions)
    tp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None  # None: a free local port (one node only)
    dp: int = 1
    router_policy: str = "cache_aware"
    num_tokenizer: int = 0
    max_queued_requests: int = 1024
    api_key: str | None = None
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = 32 << 20
    shutdown_timeout: float = 30.0
    log_stats_interval: float = 10.0
    watchdog_timeout: float = 300.0
    log_level: str | None = None  # None: MINISGL_LOG_LEVEL, else INFO
    log_requests: bool = False
    shell: bool = False
    reasoning_parser: str = "auto"
    tool_call_parser: str = "auto"
    clamp_max_tokens: bool = False
    # the output limit of a chat or Responses request that sets none (None: what the context
    # leaves after the prompt, as OpenAI, vLLM and SGLang do)
    default_max_tokens: int | None = None
    generation_config: str = "auto"
    reject_unsupported_tools: bool = False
    # images (vision-language models): MediaOptions' fields, read through ``media``
    allowed_media_domains: tuple[str, ...] = MediaOptions.allowed_media_domains
    allow_private_media: bool = MediaOptions.allow_private_media
    media_fetch_timeout: float = MediaOptions.media_fetch_timeout
    max_image_bytes: int = MediaOptions.max_image_bytes
    max_image_pixels: int = MediaOptions.max_image_pixels
    limit_mm_per_prompt: int = MediaOptions.limit_mm_per_prompt

    def __post_init__(self) -> None:
        # NOTE: the parser and sampling-default names are checked against their registries by
        # ``server/openai/options.py``, a layer above this one (the command line and the app call
        # it)
        if not self.log_stats_interval >= 0:
            raise ValueError(f"log_stats_interval: must be >= 0, got {self.log_stats_interval}")
        if not self.shutdown_timeout >= 0:
            raise ValueError(f"shutdown_timeout: must be >= 0, got {self.shutdown_timeout}")
        if not self.watchdog_timeout >= 0:
            raise ValueError(f"watchdog_timeout: must be >= 0, got {self.watchdog_timeout}")
        if self.default_max_tokens is not None and not (
                isinstance(self.default_max_tokens, int) and self.default_max_tokens >= 1):
            raise ValueError(f"default_max_tokens: must be a positive integer, "
                             f"got {self.default_max_tokens!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be in [0, 65535] (0: any free port), got {self.port}")
        if self.tp < 1 or self.nnodes < 1 or self.tp % self.nnodes:
            raise ValueError(f"tp: must be a positive multiple of nnodes ({self.nnodes}), "
                             f"got {self.tp}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("dist_init_addr: required with nnodes > 1 (host:port of node 0)")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank: must be in [0, {self.nnodes}), got {self.node_rank}")
        check_dp(self)
        _ = self.media  # MediaOptions checks its fields
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("ssl_keyfile: give both ssl_keyfile and ssl_certfile, or neither")
        if self.log_level is not None and self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"log_level: {self.log_level!r} is not one of "
                             f"{', '.join(n.lower() for n in LOG_LEVELS)}")

    @property
    def media(self) -> MediaOptions:
        return MediaOptions(self.allowed_media_domains, self.allow_private_media,
                            self.media_fetch_timeout, self.max_image_bytes, self.max_image_pixels,
                            self.limit_mm_per_prompt)

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            from minisgl.models.default_model import DEFAULT_MODEL_NAME

            return DEFAULT_MODEL_NAME
        return self.model.rstrip("/")


ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "least_load", "prefix_hash",
                   "random")


def check_dp(config: ServerConfig) -> None:
    """Data parallelism runs whole servers behind a router, on one machine."""
    if config.dp < 1:
        raise ValueError(f"dp: must be >= 1, got {config.dp}")
    if config.router_policy not in ROUTER_POLICIES:
        raise ValueError(f"router_policy: must be one of {', '.join(ROUTER_POLICIES)}, "
                         f"got {config.router_policy!r}")
    if config.dp > 1 and config.nnodes > 1:
        raise ValueError("dp: --dp starts replicas on this machine only; across machines, start "
                         "one server per replica and the router by hand (docs/deployment.md)")
    if config.dp > 1 and config.shell:
        raise ValueError("dp: the terminal chat (--shell) runs one replica")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
