"""The checkpoint's recommended sampling, as the default of requests that omit it.

A model's ``generation_config.json`` may carry the sampling its authors recommend (Qwen3:
temperature 0.6, top_p 0.95, top_k 20). As vLLM does (its ``--generation-config auto``), a request
that omits one of ``temperature``, ``top_p``, ``top_k``, ``min_p`` or ``repetition_penalty`` gets
the checkpoint's value; a value the request gives always wins. ``--generation-config none`` turns
this off (the server's own defaults: temperature 1, no top-p/top-k/min-p, no penalty); a directory
reads its ``generation_config.json`` instead of the model's.
"""

from __future__ import annotations

import json
import os
from typing import Any

from minisgl.params import SamplingParams
from minisgl.utils import init_logger

logger = init_logger(__name__)

FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def check_choice(value: str) -> str:
    if value not in ("auto", "none") and not os.path.isdir(value):
        raise ValueError(f"generation_config: must be auto, none or a directory, got {value!r}")
    return value


def load_sampling_defaults(choice: str, model_path: str | None) -> dict[str, Any]:
    """The defaults that ``choice`` (``auto``: the model's directory) gives; invalid ones are
    dropped with a warning (a checkpoint's bad value must not fail every request)."""
    folder = model_path if choice == "auto" else None if choice == "none" else choice
    path = os.path.join(folder, "generation_config.json") if folder else None
    if path is None or not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        logger.warning("generation_config.json unreadable (%s); no sampling defaults", e)
        return {}
    defaults = {}
    for name in FIELDS:
        if name in config and config[name] is not None:
            try:
                SamplingParams(**{name: config[name]})
            except (ValueError, TypeError) as e:
                logger.warning("generation_config.json: %s ignored (%s)", name, e)
                continue
            defaults[name] = config[name]
    return defaults


def log_defaults(defaults: dict[str, Any]) -> None:
    if defaults:
        given = ", ".join(f"{k}={v}" for k, v in defaults.items())
        logger.info("sampling defaults from the model's generation_config.json: %s (for requests "
                    "that omit them; --generation-config none turns this off)", given)


def apply_defaults(req: Any, defaults: dict[str, Any]) -> Any:
    """Fill a parsed chat/completions request's omitted (None) sampling fields."""
    for name, value in defaults.items():
        if getattr(req, name) is None:
            setattr(req, name, value)
    return req


def apply_to_dict(given: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The same for ``/generate``'s ``sampling_params`` (a JSON null counts as omitted)."""
    return {**defaults, **{k: v for k, v in given.items() if v is not None or k not in defaults}}
