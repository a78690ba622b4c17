"""flash-linear-attention's chunked gated delta rule, imported without the packages around it.

``fla.ops``' ``__init__`` imports every op family fla has (about 35, each a set of Triton
kernels), and ``fla.modules``' and ``fla.modules.norm``'s import their layers, whose
``torch.compile`` decorators import torch's compiler stack: seconds of a hybrid model's start,
for one function. So the three packages are entered as bare package modules (their search path
only, their ``__init__`` not run) while ``fla.ops.gated_delta_rule`` and what it imports load,
and taken out again afterwards: a later ``import fla.ops`` runs the package's own ``__init__``,
which finds the loaded submodules where they are. Should an fla version's delta rule need a
name from those ``__init__`` files, the attempt is undone and the package imported as usual.

The modules left still wrap their entry points in ``torch.compiler.disable`` as they load (fla's
backend dispatch does it to every function it dispatches), and that call imports all of
``torch._dynamo``: most of what remained of the import. While they load, ``torch.compiler.disable``
is a stand-in (``_deferred_disable``) whose wrapper calls the function itself as long as
``torch._dynamo`` was never imported (nothing can be compiling then, and the real wrapper only
switches off a frame callback that no one set), and goes through the real wrapper from the first
call after it was; it carries the real wrapper's markers, so Dynamo tracing a caller skips it as it
skips the real one. The real ``torch.compiler.disable`` is back once the import ends.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any, Callable, Iterator

import torch

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
        with _compiler_disable_deferred():
            importlib.import_module(_RULE)
    except ImportError:  # this fla's delta rule needs its packages whole: undone, imported as usual
        for name in set(sys.modules) - before:
            sys.modules.pop(name, None)
        entered.clear()
    finally:
        for name in entered:
            sys.modules.pop(name, None)


@contextlib.contextmanager
def _compiler_disable_deferred() -> Iterator[None]:
    """``torch.compiler.disable`` bound to ``_deferred_disable`` inside the block, unless
    ``torch._dynamo`` is loaded already (then the real one costs nothing); the real one after."""
    real = torch.compiler.disable
    if "torch._dynamo" not in sys.modules:
        # NOTE: process-wide while it lasts: another thread's disable gets the stand-in too,
        # which behaves as the real one
        torch.compiler.disable = functools.partial(_deferred_disable, real)
    try:
        yield
    finally:
        torch.compiler.disable = real


def _deferred_disable(real: Callable, fn: Any = None, recursive: bool = True, *,
                      reason: str | None = None) -> Any:
    """``real(fn, recursive, reason=reason)`` (``torch.compiler.disable``) without importing
    ``torch._dynamo`` for a plain function: see the module's docstring. Any other form (a
    decorator factory, a module or class, a non-recursive disable) goes to ``real``."""
    # a disabled function disabled again wraps the innermost one, as Dynamo's ``innermost_fn``
    while getattr(fn, "_torchdynamo_wrapper_id", None) == id(fn):
        fn = fn._torchdynamo_orig_callable
    if not (isinstance(fn, types.FunctionType) and recursive):
        return real(fn, recursive, reason=reason)
    wrapped: Callable | None = None

    @functools.wraps(fn)
    def disabled(*args: Any, **kwargs: Any) -> Any:
        nonlocal wrapped
        call = wrapped
        if call is None:
            if "torch._dynamo" not in sys.modules:  # nothing compiles: the real wrapper's no-op
                return fn(*args, **kwargs)
            call = wrapped = real(fn, reason=reason)
        return call(*args, **kwargs)

    # the markers Dynamo reads on the real wrapper (``DisableContext.__call__``)
    markers = {"_torchdynamo_disable": True, "_torchdynamo_disable_msg": reason,
               "_torchdynamo_orig_callable": fn, "_torchdynamo_wrapper_id": id(disabled),
               "_torchdynamo_disable_recursive": True}
    for name, value in markers.items():
        setattr(disabled, name, value)
    return disabled
