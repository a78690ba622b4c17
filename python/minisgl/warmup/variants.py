"""Triton kernel variants: what a launch compiles, recorded without launching, compiled later.

Triton compiles a kernel once per *variant*: its constexpr values, the dtypes of its pointer
arguments and whether each is 16-byte aligned, each specialised integer argument's class (equal to
1, divisible by 16, neither; 32 or 64 bits) and the launch options (``num_warps``, ...). A
``Variant`` is that key with nothing else (no shapes, no values of unspecialised arguments), so
two launches of one variant compare equal and a set of them is what a warm-up must compile.

``record_launches`` intercepts every ``kernel[grid](...)`` of the calling thread and records its
variant instead of launching it; ``Variant.compile`` compiles one without a launch
(``JITFunction.warmup`` on stand-in arguments), which Triton's ``AsyncCompileMode`` runs on a
thread pool (``compile.py``). Autotuned kernels (a library's ``triton.autotune``) cannot be
compiled ahead: their config is chosen by timing launches; they are recorded by name only.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from minisgl.kernel import aligned16

# integers in [-2**31, 2**31) are passed as i32, others as i64
_INT_BOUND = 1 << 31


def _int_class(value: int, specialize: bool) -> str:
    """Triton's class of an integer argument: ``1`` (a constant), ``d16`` (divisible by 16) or
    ``any``, then its width; an argument with ``do_not_specialize`` is only its width."""
    width = "32" if -_INT_BOUND <= value < _INT_BOUND else "64"
    if not specialize:
        return f"any{width}"
    if value == 1:
        return "1"
    return f"{'d16' if value % 16 == 0 else 'any'}{width}"


# a value of each integer class that Triton specialises the same way
_INT_OF_CLASS = {"1": 1, "d1632": 16, "any32": 3, "d1664": 1 << 34, "any64": (1 << 33) + 1}


def _const(value: Any) -> Any:
    """A constexpr value as plain data (JIT functions and Triton dtypes by name)."""
    from triton.runtime.jit import JITFunction

    if isinstance(value, JITFunction):
        return ("jit", f"{value.fn.__module__}:{value.fn.__qualname__}")
    if type(value).__name__ == "dtype" and type(value).__module__.startswith("triton"):
        return ("tl.dtype", str(value))
    if isinstance(value, torch.dtype):
        return ("torch.dtype", str(value))
    return value


def _unconst(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "jit":
        return _kernel_by_name(value[1])
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "tl.dtype":
        import triton.language as tl

        return tl.dtype(value[1])
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "torch.dtype":
        return getattr(torch, value[1].removeprefix("torch."))
    return value


def _kernel_by_name(name: str):
    module, qualname = name.split(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def arg_spec(value: Any, constexpr: bool, specialize: bool = True, align: bool = True) -> tuple:
    """What Triton's specialisation keeps of one argument (the module docstring); ``specialize``
    and ``align``: the parameter has no ``do_not_specialize`` / ``..._on_alignment``."""
    if constexpr:
        return ("const", _const(value))
    if isinstance(value, torch.Tensor):
        return ("ptr", str(value.dtype).removeprefix("torch."),
                aligned16(value) if align else None)
    if value is None:
        return ("none",)
    if isinstance(value, bool):
        return ("bool",)
    if isinstance(value, int):
        return ("int", _int_class(value, specialize))
    if isinstance(value, float):
        return ("float",)
    if isinstance(value, tuple):
        return ("tuple", tuple(arg_spec(v, False, specialize, align) for v in value))
    raise TypeError(f"cannot record a kernel argument of type {type(value).__name__}")


@dataclass(frozen=True, order=True)
class Variant:
    """One compiled variant of a Triton kernel: its name (``module:qualname``), the spec of each
    parameter in order (``arg_spec``) and the launch options in the order they were passed (the
    same options in another order are another entry of Triton's cache)."""

    kernel: str
    args: tuple
    options: tuple = ()

    @classmethod
    def of_launch(cls, kernel, args: tuple, kwargs: dict) -> Variant:
        """The variant a launch ``kernel[grid](*args, **kwargs)`` compiles."""
        params = _params(kernel)
        names = [p[0] for p in params]
        options = {k: v for k, v in kwargs.items() if k not in names}
        bound = inspect.signature(kernel.fn).bind(
            *args, **{k: v for k, v in kwargs.items() if k in names})
        bound.apply_defaults()
        specs = tuple(arg_spec(bound.arguments[name], *flags) for name, *flags in params)
        name = f"{kernel.fn.__module__}:{kernel.fn.__qualname__}"
        # in the launch's order: Triton's cache key holds the options' dict as a string
        return cls(name, specs, tuple((k, _const(v)) for k, v in options.items()))

    @property
    def short_name(self) -> str:
        return self.kernel.rsplit(":", 1)[-1]

    def stand_in_args(self) -> list:
        """Arguments that specialise as the recorded launch did (``JITFunction.warmup``)."""
        return [_stand_in(spec) for spec in self.args]

    def compile(self) -> Any:
        """Compile without launching (needs the GPU's driver); under ``AsyncCompileMode`` the
        compilation runs on its executor and a ``FutureKernel`` comes back."""
        kernel = _kernel_by_name(self.kernel)
        options = {k: _unconst(v) for k, v in self.options}
        return kernel.warmup(*self.stand_in_args(), grid=(1,), **options)

    def to_json(self) -> list:
        return [self.kernel, _listify(self.args), _listify(self.options)]

    @classmethod
    def from_json(cls, data: list) -> Variant:
        kernel, args, options = data
        return cls(kernel, _tuplify(args), _tuplify(options))


def _params(kernel) -> list[tuple[str, bool, bool, bool]]:
    """(name, constexpr, specialised, specialised on alignment) of each parameter, of a
    ``JITFunction`` or of the interpreter's stand-in for one (``TRITON_INTERPRET=1``)."""
    if hasattr(kernel, "params"):
        return [(p.name, p.is_constexpr, not p.do_not_specialize,
                 not p.do_not_specialize_on_alignment) for p in kernel.params]
    options = getattr(kernel, "kwargs", {})

    def listed(key: str, i: int, name: str) -> bool:
        return any(x in (i, name) for x in options.get(key) or ())

    return [(p.name, "constexpr" in str(p.annotation), not listed("do_not_specialize", i, p.name),
             not listed("do_not_specialize_on_alignment", i, p.name))
            for i, p in enumerate(inspect.signature(kernel.fn).parameters.values())]


def _listify(x: Any) -> Any:
    return [_listify(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tuplify(x: Any) -> Any:
    return tuple(_tuplify(v) for v in x) if isinstance(x, list) else x


@functools.cache
def _stand_in_class() -> type:
    """A tensor as Triton's specialisation sees it: a dtype and an address (0: aligned); Triton's
    own ``MockTensor`` (what ``warmup`` wraps a dtype in), with the address of an unaligned view
    when the launch had one."""
    from triton.runtime.jit import MockTensor

    class StandIn(MockTensor):
        def __init__(self, dtype: torch.dtype, aligned: bool) -> None:
            super().__init__(dtype)
            self._ptr = 0 if aligned else 2 if dtype.itemsize <= 2 else 8

        def data_ptr(self) -> int:  # type: ignore[override]
            return self._ptr

    return StandIn


def _stand_in(spec: tuple) -> Any:
    kind = spec[0]
    if kind == "const":
        return _unconst(spec[1])
    if kind == "ptr":
        return _stand_in_class()(getattr(torch, spec[1]), spec[2] is not False)
    if kind == "none":
        return None
    if kind == "bool":
        return False
    if kind == "int":
        return _INT_OF_CLASS[spec[1]]
    if kind == "float":
        return 1.5
    if kind == "tuple":
        return tuple(_stand_in(s) for s in spec[1])
    raise ValueError(f"unknown argument spec {spec!r}")


@dataclass
class Recording:
    """What a recorded run launched: the variants, and the names of kernels that cannot be
    compiled ahead (autotuned)."""

    variants: set[Variant] = field(default_factory=set)
    autotuned: set[str] = field(default_factory=set)

    def update(self, other: Recording) -> None:
        self.variants |= other.variants
        self.autotuned |= other.autotuned


_local = threading.local()


def recording() -> Recording | None:
    """The calling thread's recording, if it is inside ``record_launches``."""
    return getattr(_local, "recording", None)


_patch_lock = threading.Lock()
_patched = False


def _install() -> None:
    """Route ``kernel[grid]`` through the recorder of the calling thread, if it has one (other
    threads launch as before)."""
    global _patched
    with _patch_lock:
        if _patched:
            return
        from triton.runtime.jit import JITFunction, KernelInterface

        original = KernelInterface.__getitem__

        def getitem(self, grid):
            rec = recording()
            if rec is None:
                return original(self, grid)
            if isinstance(self, JITFunction) or type(self).__name__ == "InterpretedFunction":
                return lambda *args, **kwargs: rec.variants.add(
                    Variant.of_launch(self, args, kwargs))
            fn = getattr(self, "fn", None)
            name = getattr(fn, "__qualname__", None) or type(self).__name__
            return lambda *args, **kwargs: rec.autotuned.add(
                f"{getattr(fn, '__module__', '?')}:{name}")

        KernelInterface.__getitem__ = getitem  # type: ignore[method-assign]
        _patched = True


@contextmanager
def record_launches(into: Recording | None = None) -> Iterator[Recording]:
    """Inside, this thread's Triton launches are recorded (``Recording``) and not run."""
    _install()
    rec = into if into is not None else Recording()
    outer = recording()
    _local.recording = rec
    try:
        yield rec
    finally:
        _local.recording = outer
