"""``benchmark/offline/spec_ab.py``: two trees' workers, the same prompts, runs alternating. Here
both "trees" are this one: the same tokens, and a ratio per pair of runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.mark.slow
def test_both_trees_decode_the_same_prompts_alternately(default_model_dir, tmp_path):
    run = subprocess.run(
        [sys.executable, "benchmark/offline/spec_ab.py", "--old-tree", ROOT, "--device", "cpu",
         "--model", default_model_dir, "--methods", "none,ngram", "--workloads", "chat",
         "--max-tokens", "12", "--repeats", "2", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    with open(tmp_path / "spec_ab_batch1.json") as f:
        records = json.load(f)["records"]
    assert sorted(r["method"] for r in records) == ["ngram", "none"]
    for r in records:
        assert r["workload"] == "chat" and len(r["pair_ratios"]) == 2
        assert r["same_tokens"]  # the same prompts, greedy: the same answers from both workers
        assert r["old_tokens_per_s"] > 0 and r["new_tokens_per_s"] > 0
    ngram = next(r for r in records if r["method"] == "ngram")
    assert ngram["verify_steps"]["old"] == ngram["verify_steps"]["new"] > 0
    assert "--out" not in open(tmp_path / "spec_ab_batch1.md").read()
