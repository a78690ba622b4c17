"""The speculative-decoding settings, from vLLM's ``--speculative-config`` JSON or SGLang's
``--speculative-algorithm`` flags.

One frozen ``SpecConfig`` reaches the scheduler; ``None`` means no speculation. Unknown keys and
methods that this build does not have (``eagle``, ``medusa``, ``draft_model``) are a
``ValueError`` naming the field. The draft of ``eagle3`` is read when the engine loads
(``models/eagle3.py``): no I/O here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "suffix", "mtp", "eagle3")
DEFAULT_DRAFTS = 4
MAX_DRAFTS = 16  # the most drafts a request may verify in one step
# suffix decoding's default ceiling: with the last token a verify step of 16 rows, the size of a
# captured decode graph (17 rows would replay the 32-row graph)
SUFFIX_DRAFTS = 15
# methods users know from vLLM / SGLang that need a draft model or head: not built here
_NOT_BUILT = {"eagle": "EAGLE-1/2 draft models",
              "draft_model": "separate draft models", "medusa": "Medusa heads"}
_SGLANG_ALGORITHMS = {"NGRAM": "ngram", "SUFFIX": "suffix", "EAGLE3": "eagle3", "EAGLE": "eagle",
                      "NEXTN": "mtp", "STANDALONE": "draft_model"}
# vLLM's suffix-decoding keys, and ours for them
_SUFFIX_KEYS = {"suffix_decoding_max_tree_depth": "max_tree_depth",
                "suffix_decoding_max_cached_requests": "max_cached_requests",
                "suffix_decoding_max_spec_factor": "max_spec_factor",
                "suffix_decoding_min_token_prob": "min_token_prob"}


@dataclass(frozen=True)
class SpecConfig:
    """``num_speculative_tokens``: the most drafts one request verifies per step (its draft
    length adapts below it, ``adaptive.py``); by default 4, and for ``suffix`` the tree's depth,
    as in vLLM (suffix decoding sizes each draft from its match, so the setting is only a
    ceiling, and copied text is drafted a long run at a time), at most ``SUFFIX_DRAFTS``.
    ``prompt_lookup_min/max``: the n-gram sizes the ``ngram`` method matches (vLLM's names).
    ``max_tree_depth``, ``max_cached_requests``, ``max_spec_factor``, ``min_token_prob``: the
    ``suffix`` method's tree depth, how many finished requests its global tree remembers,
    drafts per matched token, and the least estimated probability a drafted token may have
    (Arctic Inference's meaning). ``disable_by_batch_size``: with more running requests than this
    nobody speculates (a large batch is compute-bound: the verified tokens cost as much as they
    save). ``min_expected_accept``: a request speculates only while its recent accepted drafts
    per step are at least this (below it, a step of k+1 tokens costs more than it gains).
    ``adaptive=False`` drafts ``num_speculative_tokens`` whenever the proposer has them (the
    verify-cost benchmark, an ablation).
    ``hybrid_verify_requests``: hybrid models only, the most requests that verify drafts in one
    step; each holds ``num_speculative_tokens + 1`` recurrent-state slots (tens of MiB each on
    real models), taken from the KV cache's memory. ``model``: the ``eagle3`` method's draft
    checkpoint directory (vLLM's key; SGLang's ``--speculative-draft-model-path``)."""

    method: str = "ngram"
    model: str | None = None
    num_speculative_tokens: int | None = None  # None: the method's default (above)
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    max_tree_depth: int = 24
    max_cached_requests: int = 1000
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    disable_by_batch_size: int = 16
    min_expected_accept: float = 0.5
    hybrid_verify_requests: int = 4
    adaptive: bool = True  # False: always num_speculative_tokens drafts (an ablation)

    @property
    def max_drafts(self) -> int:
        """``num_speculative_tokens``, resolved to the method's default when not given."""
        k = self.num_speculative_tokens
        assert isinstance(k, int), "resolved in __post_init__"
        return k

    def __post_init__(self) -> None:
        if self.method in _NOT_BUILT:
            what = _NOT_BUILT[self.method]
            raise ValueError(f"speculative_config: method {self.method!r} ({what}) is not built "
                             f"in minisgl; use one of {', '.join(METHODS)}")
        if self.method not in METHODS:
            raise ValueError(f"speculative_config: method {self.method!r} is not one of "
                             f"{', '.join(METHODS)}")
        if self.method == "eagle3" and not (isinstance(self.model, str) and self.model):
            raise ValueError("speculative_config: method 'eagle3' needs 'model', the EAGLE-3 "
                             "draft's directory (--speculative-draft-model-path)")
        if self.method != "eagle3" and self.model is not None:
            raise ValueError(f"speculative_config: 'model' (a draft model) applies to method "
                             f"'eagle3', not {self.method!r}")
        if self.num_speculative_tokens is None:
            default = (min(self.max_tree_depth, SUFFIX_DRAFTS) if self.method == "suffix"
                       and isinstance(self.max_tree_depth, int) else DEFAULT_DRAFTS)
            object.__setattr__(self, "num_speculative_tokens", default)
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
                     "max_tree_depth", "max_cached_requests", "disable_by_batch_size",
                     "hybrid_verify_requests"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config: {name} must be a positive integer, "
                                 f"got {value!r}")
        if not isinstance(self.adaptive, bool):
            raise ValueError(f"speculative_config: adaptive must be a boolean, got "
                             f"{self.adaptive!r}")
        if self.max_drafts > MAX_DRAFTS:
            raise ValueError(f"speculative_config: num_speculative_tokens must be <= {MAX_DRAFTS}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError("speculative_config: prompt_lookup_min must be <= prompt_lookup_max")
        for name in ("max_spec_factor", "min_token_prob", "min_expected_accept"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"speculative_config: {name} must be a number >= 0, "
                                 f"got {value!r}")


def parse_speculative_config(value: str | dict | None) -> SpecConfig | None:
    """vLLM's ``--speculative-config`` (JSON text, or a dict offline) -> ``SpecConfig``."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"speculative_config: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError("speculative_config: must be a JSON object such as "
                         '{"method": "ngram", "num_speculative_tokens": 4}')
    known = {f.name for f in fields(SpecConfig)}
    args: dict[str, Any] = {}
    for key, item in value.items():
        name = _SUFFIX_KEYS.get(key, key)
        if name not in known:
            raise ValueError(f"speculative_config: unknown key {key!r}; known: "
                             f"{', '.join(sorted(known | set(_SUFFIX_KEYS)))}")
        args[name] = item
    if "method" not in args:
        raise ValueError("speculative_config: 'method' is required (ngram, suffix, mtp or "
                         "eagle3)")
    if "prompt_lookup_max" in args and "prompt_lookup_min" not in args:
        args["prompt_lookup_min"] = min(SpecConfig.prompt_lookup_min, args["prompt_lookup_max"])
    return SpecConfig(**args)


def from_sglang_flags(algorithm: str | None, num_draft_tokens: int | None,
                      ngram_min: int | None, ngram_max: int | None,
                      draft_model_path: str | None = None) -> dict | None:
    """SGLang's ``--speculative-algorithm NGRAM --speculative-num-draft-tokens N`` (and
    ``--speculative-draft-model-path`` for EAGLE3) as a ``speculative_config`` dict. SGLang's N
    counts the verified tokens including the last accepted one, so N tokens are N - 1 drafts."""
    if algorithm is None:
        if (num_draft_tokens is not None or ngram_min is not None or ngram_max is not None
                or draft_model_path is not None):
            raise ValueError("speculative_algorithm: the other --speculative-* flags need it")
        return None
    method = _SGLANG_ALGORITHMS.get(algorithm.upper())
    if method is None:
        raise ValueError(f"speculative_algorithm: {algorithm!r} is not one of "
                         f"{', '.join(_SGLANG_ALGORITHMS)}")
    config: dict[str, Any] = {"method": method}
    if num_draft_tokens is not None:
        if num_draft_tokens < 2:
            raise ValueError("speculative_num_draft_tokens: must be >= 2 (the last token and at "
                             "least one draft)")
        config["num_speculative_tokens"] = num_draft_tokens - 1
    if draft_model_path is not None:
        config["model"] = draft_model_path
    if ngram_min is not None:
        config["prompt_lookup_min"] = ngram_min
    if ngram_max is not None:
        config["prompt_lookup_max"] = ngram_max
    return config
