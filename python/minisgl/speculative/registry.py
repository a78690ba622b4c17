"""Proposers by method name: the one place that knows every method's class."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .config import SpecConfig
from .proposer import Proposer

if TYPE_CHECKING:
    from minisgl.engine import Engine


def create_proposer(config: SpecConfig, engine: Engine | None = None) -> Proposer:
    """The proposer of ``config.method`` (``engine``: the target's, whose model carries the MTP
    head or the EAGLE-3 draft and whose KV pool holds the head's K/V)."""
    if config.method == "ngram":
        from .ngram import NgramProposer

        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    if config.method == "suffix":
        from .suffix import SuffixProposer

        return SuffixProposer(config.max_tree_depth, config.max_cached_requests,
                              config.max_spec_factor, config.min_token_prob)
    if engine is None:
        raise ValueError(f"speculative_config: method {config.method!r} drafts with the "
                         "target model's head, and none was given")
    if config.method == "mtp":
        from .mtp import MtpProposer

        return MtpProposer(engine, config.disable_by_batch_size)
    if config.method == "eagle3":
        from .eagle3 import Eagle3Proposer

        return Eagle3Proposer(engine, config.disable_by_batch_size)
    raise ValueError(f"speculative_config: no proposer for method {config.method!r}")
