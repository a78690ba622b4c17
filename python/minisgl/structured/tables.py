"""The grammar compiler's tables of a tokenizer, and a cache of them a deployment can carry.

xgrammar needs each token's bytes and the vocabulary's kind (``TokenizerInfo``); building them
loads the tokenizer through transformers and decodes every token: on a GPU server's start that
is seconds of Python beside the engine's graph capture, and both hold the GIL. With a cache
directory (the kernel cache's, ``minisgl.warmup.cache``) the tables are kept as xgrammar's own
JSON under ``DIR/grammar/``, keyed by the tokenizer's files, the stop ids and xgrammar's version,
so a restart (or a container image filled by ``python -m minisgl warmup``) reads them back
instead. A damaged or stale entry is built anew.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from minisgl.utils import init_logger
from minisgl.utils.hf import TRANSFORMERS_IMPORT_LOCK, load_tokenizer
from minisgl.utils.tokenizer_files import TOKENIZER_FILES, digest_files

logger = init_logger(__name__)

# bumped when an entry's contents change meaning
_FORMAT = 1


def _xgr() -> Any:
    try:
        with TRANSFORMERS_IMPORT_LOCK:  # xgrammar imports transformers
            import xgrammar
    except ImportError as e:  # a runtime dependency; only a broken install gets here
        raise ImportError("structured output needs xgrammar: pip install xgrammar") from e
    return xgrammar


@dataclass(frozen=True)
class TokenizerTables:
    """What the grammar compiler needs of a tokenizer: xgrammar's ``TokenizerInfo`` (its width
    is the tokenizer's length rounded up to 32 ids, ``fill_vocab_size``) and that length."""

    info: Any
    length: int

    @property
    def fill_vocab_size(self) -> int:
        return (self.length + 31) // 32 * 32

    @classmethod
    def from_tokenizer(cls, tokenizer: Any,
                       stop_token_ids: tuple[int, ...] = ()) -> TokenizerTables:
        length = len(tokenizer)
        info = _xgr().TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=(length + 31) // 32 * 32,
            stop_token_ids=list(stop_token_ids) or None)
        return cls(info, length)


def _key(model_dir: str, stop_token_ids: tuple[int, ...]) -> str | None:
    """The entry's name: a digest of the tokenizer's files (None: it has none here)."""
    from importlib.metadata import version

    digest = hashlib.sha256(json.dumps([_FORMAT, version("xgrammar"), sorted(stop_token_ids)])
                            .encode())
    found = digest_files(digest, model_dir, TOKENIZER_FILES)  # a change to any: a new key
    return digest.hexdigest()[:24] if found else None


def load_tables(model_dir: str, stop_token_ids: tuple[int, ...],
                cache_dir: str | None = None) -> TokenizerTables | None:
    """The tables of ``model_dir``'s tokenizer (None when it ships none), read from
    ``cache_dir`` when an entry is there, else built (and written there). With a cache directory
    a missing entry is built in a process of its own and read back: loading the tokenizer and
    decoding every token is seconds of Python that would hold this process's interpreter while
    its engine starts (the scheduler's kernel discovery, its graph capture)."""
    start = time.perf_counter()  # the start-up log says where a start's seconds went
    key = _key(model_dir, stop_token_ids) if cache_dir and os.path.isdir(model_dir) else None
    path = os.path.join(cache_dir, "grammar", f"{key}.json") if cache_dir and key else None
    if path is not None:
        how = "read from the cache"
        if not os.path.isfile(path) and _build_elsewhere(model_dir, stop_token_ids, cache_dir,
                                                         path):
            how = "built in a process of their own"
        tables = _read(path) if os.path.isfile(path) else None
        if tables is not None:
            logger.info("grammar tables: %s in %.1f s", how, time.perf_counter() - start)
            return tables
    tables = _build(model_dir, stop_token_ids, cache_dir, path)
    if tables is not None:
        logger.info("grammar tables: built in %.1f s", time.perf_counter() - start)
    return tables


def _build(model_dir: str, stop_token_ids: tuple[int, ...], cache_dir: str | None,
           path: str | None) -> TokenizerTables | None:
    """The tables built from the tokenizer, in this process (written to ``path``, if any)."""
    tokenizer = load_tokenizer(model_dir, cache_dir=cache_dir)
    if tokenizer is None:
        return None
    tables = TokenizerTables.from_tokenizer(tokenizer, stop_token_ids)
    if path is not None:
        _write(path, tables)
    return tables


def _read(path: str) -> TokenizerTables | None:
    try:
        with open(path, encoding="utf-8") as f:
            entry = json.load(f)
        return TokenizerTables(_xgr().TokenizerInfo.deserialize_json(entry["info"]),
                               int(entry["length"]))
    except Exception as e:  # noqa: BLE001 - damaged, or another xgrammar's format
        logger.warning("grammar tables: ignoring %s (%s: %s)", path, type(e).__name__, e)
        return None


def _write(path: str, tables: TokenizerTables) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"  # written whole or not at all (a rename)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"length": tables.length, "info": tables.info.serialize_json()}, f)
    os.replace(tmp, path)


def _build_elsewhere(model_dir: str, stop_token_ids: tuple[int, ...], cache_dir: str,
                     path: str) -> bool:
    """Build the entry at ``path`` in a child process (whether it did). A plain subprocess: the
    scheduler runs in a daemonic process, which multiprocessing forbids children."""
    import subprocess
    import sys

    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    code = ("import sys; from minisgl.structured.tables import _child; "
            "_child(sys.argv[1], int(sys.argv[2]))")
    args = json.dumps([model_dir, list(stop_token_ids), cache_dir, path])
    try:
        run = subprocess.run([sys.executable, "-c", code, args, str(os.getpid())], env=env,
                             capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.warning("grammar tables: the child that builds them failed (%s)", e)
        return False
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        logger.warning("grammar tables: the child that builds them failed (%s)", last)
        return False
    return True


def _child(args: str, parent: int) -> None:
    """The child's work: build the entry, and die with the process that asked (killed or ended
    meanwhile: Linux's parent-death signal; elsewhere it finishes its build and ends)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # it ended before the line above
        return
    model_dir, stops, cache_dir, path = json.loads(args)
    _build(model_dir, tuple(stops), cache_dir, path)
