"""The first-minute benchmark's offline mode: the ``LLM`` of the server's arguments started in a
process of its own, its time to ready from that process's start, then each kind of request
twice."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_offline_llms_first_minute(tmp_path):
    config = json.load(open("benchmark/configs/qwen3-0.6b.json"))
    config.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, vocab_size=512,
                  max_position_embeddings=1024)
    (tmp_path / "config.json").write_text(json.dumps(config))
    sys.path.insert(0, "benchmark/online")
    from dummy_model import write_dummy_model

    model = write_dummy_model(str(tmp_path / "config.json"), str(tmp_path / "model"))
    out = tmp_path / "out"
    subprocess.run([sys.executable, "benchmark/online/first_minute.py", "--out", str(out),
                    "--tag", "tiny_llm-empty", "--offline", "--cache-dir", str(tmp_path / "k"),
                    "--timeout", "300", "--", "--model", model, "--dummy-weights",
                    "--max-running-requests", "3"],
                   check=True, timeout=400, capture_output=True)
    result = json.loads((out / "first_minute_tiny_llm-empty.json").read_text())
    assert 0 < result["ready_s"] < 300
    # the server's arguments are the LLM's options, every one of them
    assert result["options"]["max_running_requests"] == "3"
    assert result["options"]["cache_dir"] == str(tmp_path / "k")
    kinds = {row["kind"]: row for row in result["requests"]}
    assert set(kinds) == {"greedy", "sampled", "json_schema"}  # no forced tool call offline
    assert all(row["first_s"] > 0 and row["second_s"] > 0 and row["error"] is None
               for row in kinds.values())
    # the dummy tokenizer can write JSON: the schema's request decodes past its first token
    assert kinds["json_schema"]["tokens"][0] > 1
    assert kinds["greedy"]["tokens"] == [8, 8]
