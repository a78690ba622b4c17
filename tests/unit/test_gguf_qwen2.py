"""A Qwen2-architecture GGUF (llama.cpp's converter keeps HF's q/k row order for it, and the
q/k/v biases) becomes a ``Qwen2ForCausalLM`` config and state dict; a Llama one still has its
q/k rows un-permuted. Tiny files written with the ``gguf`` package, float32 tensors."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from minisgl.models.gguf import _read_gguf, _unpermute_rotary  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 16, 4, 2, 24, 32


def write_tiny(path, arch: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1e6)
    kv = HIDDEN // HEADS * KV_HEADS
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,),
              "output.weight": (VOCAB, HIDDEN), "blk.0.attn_norm.weight": (HIDDEN,),
              "blk.0.ffn_norm.weight": (HIDDEN,), "blk.0.attn_q.weight": (HIDDEN, HIDDEN),
              "blk.0.attn_q.bias": (HIDDEN,), "blk.0.attn_k.weight": (kv, HIDDEN),
              "blk.0.attn_k.bias": (kv,), "blk.0.attn_v.weight": (kv, HIDDEN),
              "blk.0.attn_v.bias": (kv,), "blk.0.attn_output.weight": (HIDDEN, HIDDEN),
              "blk.0.ffn_gate.weight": (FFN, HIDDEN), "blk.0.ffn_up.weight": (FFN, HIDDEN),
              "blk.0.ffn_down.weight": (HIDDEN, FFN)}
    tensors = {name: rng.standard_normal(shape).astype(np.float32)
               for name, shape in shapes.items()}
    for name, t in tensors.items():
        writer.add_tensor(name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_qwen2_and_llama_layouts(tmp_path, arch):
    written = write_tiny(tmp_path / "tiny.gguf", arch)
    config, state = _read_gguf(gguf.GGUFReader(str(tmp_path / "tiny.gguf")))
    expected = {"qwen2": ("Qwen2ForCausalLM", True), "llama": ("LlamaForCausalLM", False)}[arch]
    assert (config["architectures"][0], config["attention_bias"]) == expected
    assert config["num_key_value_heads"] == KV_HEADS and not config["tie_word_embeddings"]
    q = written["blk.0.attn_q.weight"]
    k_bias = written["blk.0.attn_k.bias"]
    if arch == "llama":
        q, k_bias = _unpermute_rotary(q, HEADS), _unpermute_rotary(k_bias, KV_HEADS)
    np.testing.assert_array_equal(state["model.layers.0.self_attn.q_proj.weight"].numpy(), q)
    np.testing.assert_array_equal(state["model.layers.0.self_attn.k_proj.bias"].numpy(), k_bias)
    np.testing.assert_array_equal(state["lm_head.weight"].numpy(), written["output.weight"])


def test_other_architectures_are_refused(tmp_path):
    write_tiny(tmp_path / "tiny.gguf", "gemma2")
    with pytest.raises(ValueError, match="architecture 'gemma2' is not supported"):
        _read_gguf(gguf.GGUFReader(str(tmp_path / "tiny.gguf")))
