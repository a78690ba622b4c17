"""Sanity tests of tests/hf_models.py (the transformers reference helper)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from safetensors.torch import load_file

from helpers.hf_models import (
    ARCHS,
    greedy_margins,
    hf_greedy,
    hf_model,
    hf_prefill_logits,
    make_tiny_checkpoint,
    random_prompts,
)

VOCAB = 256
LENGTHS = [5, 17, 33, 60]
NEW_TOKENS = 24
MIN_GAP = 1e-2


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_tiny")
    return {arch: make_tiny_checkpoint(arch, root / arch) for arch in ARCHS}


@pytest.fixture(scope="module")
def prompts():
    # Same shapes/seeds as the parity tests use (seed 0), plus seed 1.
    return random_prompts(4, LENGTHS, VOCAB, seed=0) + random_prompts(4, LENGTHS, VOCAB, seed=1)


@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoint_files_and_config(ckpts, arch):
    path = ckpts[arch]
    assert (path / "model.safetensors").is_file()
    gen_cfg = json.loads((path / "generation_config.json").read_text())
    assert gen_cfg["eos_token_id"] == 2
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == arch
    assert cfg["hidden_size"] == 64
    assert cfg["intermediate_size"] == 128
    assert cfg["num_hidden_layers"] == 2
    assert cfg["num_attention_heads"] == 4
    assert cfg["num_key_value_heads"] == 2
    assert cfg["head_dim"] == 16
    assert cfg["vocab_size"] == VOCAB
    assert cfg["max_position_embeddings"] == 512
    assert cfg["rms_norm_eps"] == 1e-6
    assert cfg["bos_token_id"] == 1 and cfg["eos_token_id"] == 2
    assert cfg["tie_word_embeddings"] is False
    # Both config spellings are present (transformers 4.x and 5.x).
    assert "rope_theta" in cfg and "rope_scaling" in cfg
    assert cfg["rope_parameters"]["rope_theta"] == cfg["rope_theta"]
    if arch == "qwen3_moe":
        assert cfg["num_experts"] == 4 and cfg["num_experts_per_tok"] == 2
        assert cfg["moe_intermediate_size"] == 32 and cfg["norm_topk_prob"] is True
    if arch == "mistral":
        assert cfg["sliding_window"] is None


@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_perturbed_and_loaded(ckpts, arch):
    path = ckpts[arch]
    model = hf_model(path)
    assert hf_model(str(path)) is model  # cached per path
    assert not model.training
    saved = load_file(str(path / "model.safetensors"))
    assert len(saved) > 0
    for name, t in saved.items():
        assert t.dtype == torch.float32, name
        assert not torch.all(t == 1), f"{name} is all ones"
        assert not torch.all(t == 0), f"{name} is all zeros"
        if "norm" in name:
            assert (t - 1).abs().max() > 0.05, name
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, name
        assert not torch.all(p == 1), f"{name} is all ones"
        assert not torch.all(p == 0), f"{name} is all zeros"
    # Loaded weights equal the saved ones (names that map 1:1).
    state = model.state_dict()
    common = [k for k in saved if k in state]
    assert common, "no common tensor names between file and model"
    for k in common:
        assert torch.equal(state[k], saved[k]), k
    names = set(saved)
    if arch == "qwen2":
        assert "model.layers.0.self_attn.q_proj.bias" in names
        assert "model.layers.0.self_attn.k_proj.bias" in names
        assert "model.layers.0.self_attn.v_proj.bias" in names
    if arch in ("qwen3", "qwen3_moe"):
        assert "model.layers.0.self_attn.q_norm.weight" in names
        assert "model.layers.0.self_attn.k_norm.weight" in names
    if arch == "qwen3_moe":
        router = saved["model.layers.0.mlp.gate.weight"]
        assert router.shape == (4, 64)
        assert router.std() > 0.5  # decisive routing


def test_llama3_rope_scaling(ckpts):
    model = hf_model(ckpts["llama"])
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    assert rope["rope_type"] == "llama3"
    assert rope["factor"] == 8.0
    assert rope["low_freq_factor"] == 1.0 and rope["high_freq_factor"] == 4.0
    assert rope["original_max_position_embeddings"] == 64
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    assert theta == 500000.0
    # The scaling really changes the inverse frequencies of a head_dim 16 model.
    inv_freq = model.model.rotary_emb.inv_freq.float()
    plain = 1.0 / (theta ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    assert inv_freq.shape == plain.shape
    assert torch.allclose(inv_freq[0], plain[0])  # high frequency kept
    assert torch.allclose(inv_freq[-1], plain[-1] / 8, rtol=1e-4)  # low freq / factor
    assert not torch.allclose(inv_freq, plain)


def test_random_prompts():
    ps = random_prompts(6, [3, 7], 50, seed=3)
    assert [len(p) for p in ps] == [3, 7, 3, 7, 3, 7]
    assert all(3 <= t < 50 for p in ps for t in p)
    assert ps == random_prompts(6, [3, 7], 50, seed=3)
    assert ps != random_prompts(6, [3, 7], 50, seed=4)


GAPS: dict[str, float] = {}


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_length_consistency_and_margins(ckpts, prompts, arch):
    path = ckpts[arch]
    outs = hf_greedy(path, prompts, NEW_TOKENS)
    assert len(outs) == len(prompts)
    assert all(len(o) == NEW_TOKENS for o in outs)
    assert all(0 <= t < VOCAB for o in outs for t in o)

    # Greedy (KV cache, generate) == argmax of a full no-cache forward; this
    # also shows EOS is neither a stop nor suppressed when ignoring it.
    full = hf_prefill_logits(path, [p + o[:-1] for p, o in zip(prompts, outs)])
    for p, o, logits in zip(prompts, outs, full):
        assert logits.shape == (len(p) + len(o) - 1, VOCAB)
        assert logits.dtype == torch.float32
        assert logits[len(p) - 1 :].argmax(-1).tolist() == o
    prefill = hf_prefill_logits(path, prompts)
    for p, lp, lf in zip(prompts, prefill, full):
        assert lp.shape == (len(p), VOCAB)
        torch.testing.assert_close(lp, lf[: len(p)], rtol=1e-4, atol=1e-4)

    gaps = greedy_margins(path, prompts, outs)
    min_gap = min(g.min().item() for g in gaps)
    GAPS[arch] = min_gap
    print(f"{arch}: min top1-top2 gap over {len(prompts)}x{NEW_TOKENS} steps = {min_gap:.4f}")
    assert min_gap > MIN_GAP, f"{arch}: greedy near-tie (gap {min_gap})"
    std = torch.cat([lf[len(p) - 1 :] for p, lf in zip(prompts, full)]).std(-1).mean()
    assert 2.0 < std < 50.0, f"{arch}: logits std {std}"


def test_greedy_stops_at_eos(ckpts, prompts):
    path = ckpts["qwen2"]
    outs = hf_greedy(path, prompts[:2], NEW_TOKENS)
    eos = outs[0][5]
    first = outs[0].index(eos)
    stopped = hf_greedy(path, prompts[:1], NEW_TOKENS, eos_token_id=eos)[0]
    assert stopped == outs[0][: first + 1]


def test_tied_embeddings(tmp_path):
    path = make_tiny_checkpoint("qwen3", tmp_path / "tied", tie_word_embeddings=True, seed=5)
    model = hf_model(path)
    assert model.config.tie_word_embeddings
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    outs = hf_greedy(path, random_prompts(1, [9], VOCAB, seed=0), 4)
    assert len(outs[0]) == 4


def test_overrides(tmp_path):
    path = make_tiny_checkpoint("llama", tmp_path / "ovr", num_kv_heads=4, num_hidden_layers=3)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 4 and cfg["num_hidden_layers"] == 3
