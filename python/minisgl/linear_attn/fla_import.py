"""flash-linear-attention's chunked gated delta rule, imported without the packages around it.

``fla.ops``' ``__init__`` imports every op family fla has (about 35, each a set of Triton
kernels), and ``fla.modules``' and ``fla.modules.norm``'s import their layers, whose
``torch.compile`` decorators import torch's compiler stack: seconds of a hybrid model's start,
for one function. So the three packages are entered as bare package modules (their search path
only, their ``__init__`` not run) while ``fla.ops.gated_delta_rule`` and what it imports load,
and taken out again afterwards: a later ``import fla.ops`` runs the package's own ``__init__``,
which finds the loaded submodules where they are. Should an fla version's delta rule need a
name from those ``__init__`` files, the attempt is undone and the package imported as usual.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Callable

# the packages whose ``__init__`` the delta rule does not need (imported parents first)
_BARE = ("fla.ops", "fla.modules", "fla.modules.norm")
_RULE = "fla.ops.gated_delta_rule"
# the kernel warm-up's shadow engine and the engine build their backends on two threads: one
# enters the bare packages at a time (the other then finds the rule loaded)
_LOCK = threading.Lock()


def chunk_gated_delta_rule() -> Callable:
    """``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` (ImportError as fla's own import
    raises it when fla-core is missing)."""
    with _LOCK:
        if _RULE not in sys.modules and "fla.ops" not in sys.modules:
            _import_bare()
    return importlib.import_module(_RULE).chunk_gated_delta_rule


def _import_bare() -> None:
    """Import the delta rule with ``_BARE``'s packages entered without their ``__init__``."""
    if importlib.util.find_spec("fla") is None:
        return  # the plain import names what is missing
    before = set(sys.modules)
    entered = []
    try:
        for name in _BARE:
            parent, _, child = name.rpartition(".")
            spec = importlib.util.find_spec(name)  # imports the parent first (entered already)
            if spec is None or spec.submodule_search_locations is None:
                return
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            module.__spec__.submodule_search_locations = list(spec.submodule_search_locations)
            module.__path__ = list(spec.submodule_search_locations)
            module.__package__ = name
            sys.modules[name] = module
            setattr(sys.modules[parent], child, module)  # ``fla.ops.x`` by attribute works too
            entered.append(name)
        importlib.import_module(_RULE)
    except ImportError:  # this fla's delta rule needs its packages whole: undone, imported as usual
        for name in set(sys.modules) - before:
            sys.modules.pop(name, None)
        entered.clear()
    finally:
        for name in entered:
            sys.modules.pop(name, None)
