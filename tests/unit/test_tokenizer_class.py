"""The tokenizer class AutoTokenizer chose, kept in the kernel cache (``utils/tokenizer_class.py``):
a later load imports that class alone and gives the same tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from minisgl.utils.hf import load_tokenizer
from minisgl.utils.tokenizer_class import TokenizerClassEntry

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo 😀 2+2?"}]
TEXT = "Héllo wörld 😀 <|im_start|> naïve café\n\tdef f(x): return x ** 2"


@pytest.fixture
def model_dir(default_model_dir, tmp_path):
    """The default model's tokenizer files in a directory of their own (tests change them)."""
    here = tmp_path / "model"
    here.mkdir()
    for name in os.listdir(default_model_dir):
        if name.endswith(".json") or name.endswith(".jinja") or name.endswith(".txt"):
            shutil.copy(os.path.join(default_model_dir, name), here)
    return str(here)


def entries(cache):
    folder = os.path.join(cache, "tokenizers")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def same_tokenizer(a, b) -> None:
    assert type(a) is type(b)
    assert a.get_vocab() == b.get_vocab() and len(a) == len(b)
    assert a.encode(TEXT) == b.encode(TEXT)
    assert a.decode(a.encode(TEXT)) == b.decode(b.encode(TEXT))
    assert a.all_special_tokens == b.all_special_tokens
    assert (a.eos_token_id, a.bos_token_id, a.pad_token_id) == (b.eos_token_id, b.bos_token_id,
                                                                b.pad_token_id)
    assert (a.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
            == b.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))


def test_the_kept_class_gives_autotokenizers_tokenizer(model_dir, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    chosen = load_tokenizer(model_dir, cache_dir=cache)  # AutoTokenizer chooses, the choice kept
    (name,) = entries(cache)
    with open(os.path.join(cache, "tokenizers", name)) as f:
        assert json.load(f) == {"module": type(chosen).__module__,
                                "name": type(chosen).__qualname__}
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("AutoTokenizer ran although the class is kept")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    same_tokenizer(load_tokenizer(model_dir, cache_dir=cache), chosen)
    assert entries(cache) == [name]
    monkeypatch.undo()
    same_tokenizer(load_tokenizer(model_dir), chosen)  # no cache: AutoTokenizer, as before


def test_a_fresh_process_with_the_class_kept_imports_no_torch(model_dir, tmp_path):
    """What the kept class saves a tokenizer worker: AutoTokenizer's machinery and torch."""
    cache = str(tmp_path / "cache")
    code = ("import sys; from minisgl.utils.hf import load_tokenizer; "
            f"tok = load_tokenizer({model_dir!r}, cache_dir={cache!r}); "
            "print(len(tok), 'torch' in sys.modules, "
            "'transformers.models.auto.tokenization_auto' in sys.modules)")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=120) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    first, second = (run.stdout.split() for run in runs)
    assert first[0] == second[0]
    assert first[1:] == ["True", "True"]  # AutoTokenizer chose (and imported torch)
    assert second[1:] == ["False", "False"]  # the kept class alone


def test_changed_files_are_chosen_again(model_dir, tmp_path):
    cache = str(tmp_path / "cache")
    load_tokenizer(model_dir, cache_dir=cache)
    path = os.path.join(model_dir, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["model_max_length"] = 1234
    with open(path, "w") as f:
        json.dump(config, f)
    load_tokenizer(model_dir, cache_dir=cache)
    assert len(entries(cache)) == 2  # a new key: AutoTokenizer decided again


def test_a_damaged_entry_falls_back_to_autotokenizer(model_dir, tmp_path):
    cache = str(tmp_path / "cache")
    chosen = load_tokenizer(model_dir, cache_dir=cache)
    entry = TokenizerClassEntry(model_dir, cache)
    with open(entry.path, "w") as f:
        json.dump({"module": "transformers.no_such_module", "name": "Nothing"}, f)
    assert entry.load_class() is None
    same_tokenizer(load_tokenizer(model_dir, cache_dir=cache), chosen)
    assert entry.load_class() is type(chosen)  # chosen again, and kept anew


def test_remote_code_is_never_kept(model_dir, tmp_path):
    cache = str(tmp_path / "cache")
    tokenizer = load_tokenizer(model_dir)
    path = os.path.join(model_dir, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_mine.MyTokenizer"]}
    with open(path, "w") as f:
        json.dump(config, f)
    TokenizerClassEntry(model_dir, cache).save(tokenizer)
    assert entries(cache) == []
