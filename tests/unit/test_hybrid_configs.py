"""The published Qwen3.5 / Qwen3.6 / Qwen3-Next configs: parsed (text_config, layer types,
partial rotary, the typed linear-attention shape), and a shrunk copy of each runs on
``--dummy-weights`` (bench.py's path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minisgl import LLM, SamplingParams
from minisgl.models import ModelConfig, get_model_class

CONFIGS = Path(__file__).resolve().parents[2] / "benchmark" / "configs"
NAMES = ["qwen3.5-9b.json", "qwen3.6-35b-a3b.json"]


@pytest.mark.parametrize("name", NAMES)
def test_real_config_parses(name):
    raw = json.loads((CONFIGS / name).read_text())
    cfg = ModelConfig.from_dict(raw)
    text = raw["text_config"]
    assert cfg.hidden_size == text["hidden_size"] and cfg.num_layers == text["num_hidden_layers"]
    assert cfg.vocab_size == text["vocab_size"] and cfg.eos_token_ids == (text["eos_token_id"],)
    types = cfg.hybrid.layer_types
    assert types.count("full_attention") * 4 == len(types)
    assert int(cfg.head_dim * cfg.hybrid.rotary_fraction) == cfg.head_dim // 4
    assert cfg.hybrid.linear.num_value_heads == text["linear_num_value_heads"]
    assert cfg.architecture == raw["architectures"][0]
    assert get_model_class(cfg.architecture).__name__ == "Qwen3_5ForConditionalGeneration"
    assert cfg.is_moe == ("num_experts" in text)


def _shrink(raw: dict) -> dict:
    text = dict(raw["text_config"])
    text.update(hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                layer_types=text["layer_types"][:4], num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                vocab_size=512, max_position_embeddings=1024)
    if "num_experts" in text:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                    shared_expert_intermediate_size=16)
    return {**raw, "text_config": text}


@pytest.mark.parametrize("name", NAMES)
def test_dummy_weights_run(name, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_shrink(json.loads((CONFIGS / name)
                                                                          .read_text()))))
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", dummy_weights=True, num_pages=256)
    out = llm.generate([[5, 6, 7, 8, 9]], SamplingParams(temperature=0, max_tokens=4,
                                                         ignore_eos=True))
    assert len(out[0].token_ids) == 4
    llm.scheduler.check_integrity()


def test_state_stats_reported(tmp_path):
    """The scheduler's stats (what /metrics exports) give the state pool's occupancy."""
    from minisgl.scheduler.stats import state_stats

    raw = _shrink(json.loads((CONFIGS / NAMES[0]).read_text()))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", dummy_weights=True, num_pages=256,
              max_running_requests=4, num_state_snapshots=3)
    stats = state_stats(llm.scheduler)
    assert stats["state_slots_total"] == 4 and stats["state_slots_used"] == 0
    assert stats["state_snapshots"] == 0
    assert stats["state_pool_bytes"] == llm.scheduler.engine.state_pool.total_bytes > 0
    llm.generate([list(range(5, 21))], SamplingParams(temperature=0, max_tokens=2))
    assert state_stats(llm.scheduler)["state_snapshots"] >= 1  # the prompt's end was kept
