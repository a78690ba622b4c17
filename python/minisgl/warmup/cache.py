"""The kernel cache: one directory a deployment can carry (bake it into a container image).

::

    DIR/
      <platform>/                     GPU name, capability, driver, torch and Triton versions
        triton/                       TRITON_CACHE_DIR: compiled variants, Triton's launchers,
                                      autotuning results (TRITON_CACHE_AUTOTUNING)
        plans/<model key>.json        the variants a configuration needs (``KernelSet``): a
                                      restart compiles (loads) them at once, no shadow run
        plans/<model key>.config.json what made the key (the model's config.json, the engine's
                                      options), for a person reading the directory
        plans/<model key>.finished    a warm-up with that plan compiled all of it (without it,
                                      a restart compiles the rest in processes of their own)
        plans/<model key>.peaks.json  the activation peaks that size the KV pool
                                      (``engine/memory.py``), valid for the code that measured
                                      them (a digest of minisgl's sources)
      grammar/<tokenizer key>.json    the grammar compiler's tables of a tokenizer
                                      (``minisgl.structured.tables``: the same on every GPU)
      tokenizers/<tokenizer key>.json the class AutoTokenizer chose for a tokenizer, which a
                                      restart imports alone (``utils/tokenizer_class.py``)

Everything here is independent of the process that wrote it: Triton's cache is addressed by the
kernel's source, its specialisation and the compiler's versions, so one directory holds any
number of models and a mismatch only means a miss (compiled anew), never a wrong kernel; the
absolute paths inside Triton's group files are rewritten to where the directory is now when it is
opened (``relocate_triton_groups``), so it can be moved. The
platform directory keeps what one GPU and one software stack made apart from the others.

``DIR``: ``--cache-dir`` (``LLM(cache_dir=...)``), else ``$MINISGL_KERNEL_CACHE_DIR``, else
``$MINISGL_CACHE_DIR/kernels``. Without the first two, a ``TRITON_CACHE_DIR`` set by the user is
kept as Triton's directory.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass

import torch

from minisgl.engine.config import EngineConfig
from minisgl.env import kernel_cache_root
from minisgl.utils import init_logger

from .discover import KernelSet

logger = init_logger(__name__)

# engine options that change no kernel (sizes of pools, seeds, where things are)
_NOT_IN_KEY = {"model_path", "num_pages", "kv_cache_memory_gb", "mem_fraction", "dummy_weights",
               "seed", "dist_init_addr", "kernel_cache_dir", "precompile", "device"}


@dataclass(frozen=True)
class Platform:
    gpu: str
    capability: tuple[int, int]
    driver: str
    torch: str
    triton: str

    @classmethod
    def current(cls, device: torch.device) -> Platform:
        import triton

        props = torch.cuda.get_device_properties(device)
        return cls(props.name, (props.major, props.minor), _driver_version(),
                   torch.__version__, triton.__version__)

    @property
    def dirname(self) -> str:
        gpu = re.sub(r"[^A-Za-z0-9.]+", "-", self.gpu).strip("-")
        torch_v = self.torch.split("+")[0]
        return (f"{gpu}-sm{self.capability[0]}{self.capability[1]}-driver{self.driver}"
                f"-torch{torch_v}-triton{self.triton}")


def _driver_version() -> str:
    """The CUDA driver's version (e.g. ``12.8``) from ``libcuda`` (torch exposes none), or
    ``unknown``."""
    import ctypes

    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
            return "unknown"
    except (OSError, AttributeError):  # no driver library (or not this one)
        return "unknown"
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


# bumped when a plan's contents change meaning (2: launch options kept in their launch order)
PLAN_FORMAT = 2


def model_key(config: EngineConfig, grammar: bool) -> tuple[str, dict]:
    """A key of what decides the variants: the model's ``config.json``, the engine's options
    (``_NOT_IN_KEY`` aside) and whether requests can carry a grammar; and the key's contents."""
    path = os.path.join(config.model_path, "config.json")
    with open(path) as f:
        model = json.load(f)
    engine = {f.name: str(getattr(config, f.name)) for f in dataclasses.fields(config)
              if f.name not in _NOT_IN_KEY}
    what = {"model": model, "engine": engine, "grammar": grammar, "format": PLAN_FORMAT}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]
    name = str(model.get("architectures", ["model"])[0])
    return f"{name}-{digest}", what


class KernelCache:
    """The cache of one platform under ``root`` (the module docstring's layout)."""

    def __init__(self, root: str, platform: Platform) -> None:
        self.root = root
        self.platform = platform
        self.dir = os.path.join(root, platform.dirname)
        self.triton_dir = os.path.join(self.dir, "triton")
        self.plans_dir = os.path.join(self.dir, "plans")

    def plan_path(self, key: str) -> str:
        return os.path.join(self.plans_dir, f"{key}.json")

    def load_plan(self, key: str) -> KernelSet | None:
        try:
            with open(self.plan_path(key)) as f:
                return KernelSet.from_json(f.read())
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:  # an older or damaged plan: find anew
            logger.warning("kernel cache: ignoring %s (%s)", self.plan_path(key), e)
            return None

    def save_plan(self, key: str, kernels: KernelSet, what: dict) -> None:
        """Written whole or not at all (a rename), so a reader never sees half a plan."""
        _write_whole(self.plan_path(key), kernels.to_json())
        _write_whole(os.path.join(self.plans_dir, f"{key}.config.json"),
                     json.dumps({"platform": dataclasses.asdict(self.platform), **what},
                                indent=1, sort_keys=True))

    def finished(self, key: str) -> bool:
        return os.path.exists(os.path.join(self.plans_dir, f"{key}.finished"))

    def mark_finished(self, key: str) -> None:
        os.makedirs(self.plans_dir, exist_ok=True)
        with open(os.path.join(self.plans_dir, f"{key}.finished"), "w"):
            pass

    def load_peaks(self, key: str) -> dict[str, int] | None:
        """The peaks kept for ``key`` by this very code, else None (measured anew)."""
        try:
            with open(os.path.join(self.plans_dir, f"{key}.peaks.json")) as f:
                kept = json.load(f)
            if kept.pop("source") != source_digest():
                return None
            return {"forward": int(kept["forward"]), "tower": int(kept["tower"])}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def save_peaks(self, key: str, peaks: dict[str, int]) -> None:
        _write_whole(os.path.join(self.plans_dir, f"{key}.peaks.json"),
                     json.dumps({**peaks, "source": source_digest()}))


def _write_whole(path: str, text: str) -> None:
    """Written whole or not at all (a rename), so a reader never sees half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@functools.cache
def source_digest() -> str:
    """A digest of minisgl's Python sources: a change to the code that measured something kept
    here (how much memory a forward takes) makes it measured again."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(package):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, package).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:20]


def open_kernel_cache(root: str | None, device: torch.device) -> KernelCache:
    """The cache for ``device`` under ``root`` (None: ``env.kernel_cache_root()``, and a user's
    ``TRITON_CACHE_DIR`` is kept); points Triton at it (its compiled kernels and its autotuning
    results) before anything compiles in this process."""
    cache = KernelCache(root or kernel_cache_root(), Platform.current(device))
    if root is not None or "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = cache.triton_dir
        os.makedirs(cache.triton_dir, exist_ok=True)
        relocate_triton_groups(cache.triton_dir)  # it may have been carried here
    os.makedirs(os.environ["TRITON_CACHE_DIR"], exist_ok=True)
    # autotuned kernels (fla's) keep their choice with the compiled ones: read at their import
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    return cache


def relocate_triton_groups(triton_dir: str) -> int:
    """Point Triton's group files at this directory: each ``__grp__*`` file lists its kernel's
    artifacts by absolute path (Triton's ``FileCacheManager``), and a lookup skips a path that
    does not exist, so a cache written elsewhere (``minisgl warmup`` on another path, a container
    image) would miss every kernel. An artifact lies beside its group file. Returns the files
    rewritten."""
    rewritten = 0
    for folder, _, files in os.walk(triton_dir):
        for name in files:
            if not (name.startswith("__grp__") and name.endswith(".json")):
                continue
            path = os.path.join(folder, name)
            try:
                with open(path) as f:
                    group = json.load(f)
                children = group["child_paths"]
                moved = {c: os.path.join(folder, os.path.basename(p))
                         for c, p in children.items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # not Triton's layout: left alone
            if moved == children:
                continue
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({**group, "child_paths": moved}, f)
            os.replace(tmp, path)
            rewritten += 1
    return rewritten
