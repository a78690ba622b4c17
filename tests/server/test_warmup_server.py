"""A real server with ``--warmup on``: the scheduler warms up before /health answers 200, says so
in its log, and serves normally afterwards (the warm-up's requests left nothing behind)."""

import re

import httpx
import pytest

from helpers.server_utils import start_server

pytestmark = pytest.mark.slow


def test_health_turns_200_after_the_warm_up(default_model_dir, tmp_path):
    srv = start_server(default_model_dir, "--num-pages", "4096", "--warmup", "on",
                       log_dir=str(tmp_path))
    try:
        log = srv.log()
        assert re.search(r"warm-up: \d+ requests in 1 waves", log), log
        assert re.search(r"warm-up done in [\d.]+ s", log), log
        body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{srv.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0
    finally:
        srv.stop()

