"""The window is what it says: a ``max_seq_len`` the KV pool cannot hold is an error at start-up
that names the flags making room; a pool shorter than the model's own length sets the window and
the log says so."""

from __future__ import annotations

import logging

import pytest

from minisgl import LLM
from minisgl.engine.window import check_pool


def test_an_asked_window_beyond_the_pool_names_the_fix():
    with pytest.raises(ValueError, match=r"max_seq_len: a window of 32768 tokens .* holds 23300 "
                                         r"tokens; give --num-pages 32769 or "
                                         r"--kv-cache-memory-gb 1\.41 or more"):
        check_pool(32768, 8192, 23300, 1, 46080, on_cpu=True)
    with pytest.raises(ValueError, match=r"--num-pages 2049 or a higher --mem-fraction"):
        check_pool(32768, 8192, 1000, 16, 46080, on_cpu=False)
    check_pool(32768, 8192, 32768, 1, 46080, on_cpu=True)  # fits


def test_the_models_length_beyond_the_pool_is_logged(caplog):
    with caplog.at_level(logging.WARNING):
        check_pool(None, 40960, 23300, 1, 46080, on_cpu=True)
    assert "the context window is 23300 tokens, what the KV pool holds, not the model's 40960" \
        in caplog.text


def test_llm_refuses_a_window_its_pool_cannot_hold(tiny_checkpoints):
    with pytest.raises(ValueError, match="--num-pages 129"):
        LLM(str(tiny_checkpoints["llama"]), device="cpu", dtype="float32", num_pages=64,
            max_seq_len=128)
