"""A scheduler's EOS ids come from the tokenizer's files (``eos_token_ids``), without transformers;
they must equal what loading the tokenizer gives (``load_eos_token_ids``), and where the files do
not settle it the tokenizer is loaded."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from minisgl.models import eos_token_ids, load_eos_token_ids
from minisgl.utils.hf import load_tokenizer, tokenizer_eos_ids

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _save_tokenizer(path, config_json: dict | None = None, **special_names) -> str:
    """A byte-level tokenizer with ``SPECIALS`` at ids 256.., saved by transformers;
    ``config_json`` entries are written into ``config.json``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.add_special_tokens(SPECIALS)
    PreTrainedTokenizerFast(tokenizer_object=core, **special_names).save_pretrained(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config_json or {}, f)
    return str(path)


def _edit(path: str, name: str, **entries) -> None:
    file = os.path.join(path, name)
    data = json.load(open(file)) if os.path.isfile(file) else {}
    with open(file, "w") as f:
        json.dump({**data, **entries}, f)


def _reference(path: str) -> tuple[int, ...]:
    return load_eos_token_ids(path, load_tokenizer(path))


@pytest.mark.parametrize("case", ["named", "with_config", "as_added_token", "in_special_map",
                                  "a_vocabulary_token"])
def test_files_give_the_tokenizers_eos(tmp_path, case):
    if case == "named":
        path = _save_tokenizer(tmp_path, eos_token="<|im_end|>")
    elif case == "with_config":  # config.json and the tokenizer name different ids: both
        path = _save_tokenizer(tmp_path, {"eos_token_id": [256, 3]}, eos_token="<|im_end|>")
    elif case == "as_added_token":  # the AddedToken form of older tokenizer_config.json files
        path = _save_tokenizer(tmp_path)
        _edit(path, "tokenizer_config.json",
              eos_token={"content": "<|im_end|>", "special": True, "__type": "AddedToken"})
    elif case == "in_special_map":
        path = _save_tokenizer(tmp_path)
        _edit(path, "special_tokens_map.json", eos_token="<|endoftext|>")
    else:
        path = _save_tokenizer(tmp_path, eos_token="a")
    assert tokenizer_eos_ids(path) is not None  # settled by the files
    assert eos_token_ids(path) == _reference(path)
    if case != "a_vocabulary_token":
        assert eos_token_ids(path) == {"named": (258,), "with_config": (3, 256, 258),
                                       "as_added_token": (258,), "in_special_map": (256,)}[case]


def test_unsettled_files_load_the_tokenizer(tmp_path):
    """An EOS the vocabulary lacks, two files naming different ones, or none naming one (the
    tokenizer's class may have a default): the tokenizer decides."""
    path = _save_tokenizer(tmp_path / "a", eos_token="<|im_end|>")
    _edit(path, "tokenizer_config.json", eos_token="<|not_there|>")
    assert tokenizer_eos_ids(path) is None
    assert eos_token_ids(path) == _reference(path)
    path = _save_tokenizer(tmp_path / "b", eos_token="<|im_end|>")
    _edit(path, "special_tokens_map.json", eos_token="<|endoftext|>")
    assert tokenizer_eos_ids(path) is None
    assert eos_token_ids(path) == _reference(path)
    path = _save_tokenizer(tmp_path / "c", {"eos_token_id": 257})
    assert tokenizer_eos_ids(path) is None
    assert eos_token_ids(path) == _reference(path) == (257,)


def test_no_tokenizer_gives_the_configs_ids(tmp_path):
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"eos_token_id": 2}, f)
    assert eos_token_ids(str(tmp_path)) == (2,)


@pytest.mark.parametrize("config", ["qwen3-8b", "qwen3.5-9b"])
def test_benchmark_model_dirs(tmp_path, config):
    """The random-weight model directories the GPU benchmarks serve (word-level and byte-level
    tokenizers over the real vocabularies)."""
    here = os.path.dirname(__file__)
    spec = importlib.util.spec_from_file_location(
        "dummy_model", os.path.join(here, "..", "..", "benchmark", "online", "dummy_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = module.write_dummy_model(
        os.path.join(here, "..", "..", "benchmark", "configs", f"{config}.json"),
        str(tmp_path / config))
    assert tokenizer_eos_ids(path) is not None
    assert eos_token_ids(path) == _reference(path)


_RACE = """
import sys, threading
from minisgl.structured.tables import _xgr
from minisgl.utils.hf import load_tokenizer
errors = []
def load(what):
    try:
        what()
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=load, args=(lambda: load_tokenizer(sys.argv[1]),))
           for _ in range(2)] + [threading.Thread(target=load, args=(_xgr,))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(errors)
"""


def test_tokenizers_load_on_several_threads_of_a_new_process(default_model_dir):
    """A scheduler loads a tokenizer for its EOS ids (files that do not settle them) while its
    grammar tables import xgrammar: transformers' first import, from two threads at once, failed
    without the lock."""
    import subprocess
    import sys

    for _ in range(2):  # the race lost about four times in five
        out = subprocess.run([sys.executable, "-c", _RACE, default_model_dir], check=True,
                             capture_output=True, text=True, timeout=120).stdout
        assert out.strip().splitlines()[-1] == "[]"
