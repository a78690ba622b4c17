"""Speculative decoding: proposers draft tokens, the target verifies them in the ordinary batch."""

from .config import METHODS, SpecConfig, from_sglang_flags, parse_speculative_config
from .decoder import DraftBudget, SpecDecoder, create_spec_decoder
from .proposer import Proposer
from .registry import create_proposer
from .stats import SpecStats

__all__ = ["METHODS", "DraftBudget", "SpecConfig", "SpecDecoder", "SpecStats", "Proposer",
           "create_proposer", "create_spec_decoder", "from_sglang_flags",
           "parse_speculative_config"]
