"""Autotuned Triton kernels' choices, shipped per GPU, so that a new machine does not tune them.

A library's ``triton.autotune`` kernel (fla's chunked delta rule: up to 48 configurations a
kernel) compiles and times every configuration on its first call with a new key: on an empty
kernel cache that is most of a hybrid model's start-up, beyond what the warm-up can compile ahead
(its choice is made by timing). The kernel cache keeps the choices once made
(``TRITON_CACHE_AUTOTUNING``). A table of them made on one GPU after a model has run (``dump``:
``benchmark/kernels/autotune_choices.py --write``) is shipped in ``autotune_tables/`` and seeds a
new machine's autotuners (``seed_shipped``): a key it holds is not tuned, and only the chosen
configuration compiles. A key it lacks (another model's shapes, a library whose configurations
changed) is tuned as before.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

from minisgl.utils import init_logger

logger = init_logger(__name__)

TABLES = Path(__file__).parent / "autotune_tables"


def table_path(gpu: str, package: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower()
    return TABLES / f"{slug}_{package}.json"


def autotuners(package: str) -> Iterator[tuple[str, Any]]:
    """The autotuned kernels of ``package``'s imported modules, each once, named
    ``module:function`` (a ``triton.heuristics`` around it is looked through)."""
    from triton.runtime.autotuner import Autotuner

    seen: set[int] = set()
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")):
            continue
        for value in list(vars(module).values()):
            for _ in range(4):  # heuristics -> autotune -> jit, at most
                if isinstance(value, Autotuner) or value is None:
                    break
                value = getattr(value, "fn", None)
            if isinstance(value, Autotuner) and id(value) not in seen:
                seen.add(id(value))
                fn = value.base_fn
                yield f"{fn.__module__}:{fn.__name__}", value


def _settings(config: Any) -> tuple:
    """A configuration as comparable data: its meta-parameters and launch options."""
    return tuple(sorted(config.all_kwargs().items()))


def dump(package: str) -> dict[str, list]:
    """Every choice ``package``'s autotuners have made in this process: per kernel, pairs of
    the key (its ``repr``) and the chosen configuration's settings."""
    table: dict[str, list] = {}
    for name, tuner in autotuners(package):
        rows = [[repr(key), dict(_settings(config))] for key, config in tuner.cache.items()]
        if rows:
            table[name] = sorted(rows)
    return table


def seed(table: dict[str, list], package: str) -> int:
    """Give ``package``'s autotuners the choices of ``table`` (``dump``'s form) for the keys they
    have not tuned yet; return how many. A choice naming a configuration the kernel no longer
    offers, or a key that does not read back, is skipped (that key is tuned as before)."""
    seeded = 0
    for name, tuner in autotuners(package):
        offered = {_settings(c): c for c in tuner.configs}
        for key, settings in table.get(name, ()):
            config = offered.get(tuple(sorted(settings.items())))
            try:
                key = ast.literal_eval(key)
            except (ValueError, SyntaxError):
                continue
            if config is not None and key not in tuner.cache:
                tuner.cache[key] = config
                seeded += 1
    return seeded


@functools.cache
def seed_shipped(package: str, gpu: str) -> int:
    """Seed ``package``'s autotuners from the table shipped for ``gpu`` (its name, as CUDA gives
    it), once a process; 0 when none is shipped."""
    path = table_path(gpu, package)
    if not path.exists():
        return 0
    seeded = seed(json.loads(path.read_text())["choices"], package)
    logger.info("%s: %d autotuned kernels' choices from %s", package, seeded, path.name)
    return seeded
