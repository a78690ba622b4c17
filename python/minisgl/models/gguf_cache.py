"""A GGUF conversion cached as a Hugging Face model directory, converted once across processes.

``convert_gguf_cached`` converts into a temporary directory under a file lock and renames it
into place, so racing processes convert once and an interrupted conversion leaves no partial
directory that passes for a complete one.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import logging
import os
import shutil
import tempfile
from typing import Iterator

from minisgl.models.gguf import convert_gguf

logger = logging.getLogger(__name__)

# Files whose presence means a conversion finished (the dir is only ever renamed in whole).
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def convert_gguf_cached(gguf_path: str, target: str) -> str:
    """Convert ``gguf_path`` into ``target`` unless a complete conversion is already there."""
    if is_complete(target):
        return target
    root, name = os.path.split(target)
    os.makedirs(root, exist_ok=True)
    # The lock serialises racing processes; the temp dir + rename makes the result atomic,
    # so an interrupted conversion leaves only a stale temp dir that the next run removes.
    with _file_lock(os.path.join(root, f".{name}.lock")):
        if is_complete(target):
            return target
        _remove_stale(root, target)
        tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=root)
        try:
            convert_gguf(gguf_path, tmp)
            _make_world_readable(tmp)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def is_complete(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, f)) for f in _REQUIRED_FILES)


@contextlib.contextmanager
def _file_lock(path: str) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _make_world_readable(path: str) -> None:
    """mkdtemp (and safetensors) create owner-only entries; a shared cache wants 755/644."""
    os.chmod(path, 0o755)
    for name in os.listdir(path):
        os.chmod(os.path.join(path, name), 0o644)


def _remove_stale(root: str, target: str) -> None:
    """Under the lock, leftovers are from dead processes: temp dirs, or a partial target."""
    for tmp in glob.glob(os.path.join(root, f".{os.path.basename(target)}.tmp-*")):
        shutil.rmtree(tmp, ignore_errors=True)
    if os.path.exists(target):
        logger.warning("Removing incomplete model dir %s", target)
        shutil.rmtree(target)
