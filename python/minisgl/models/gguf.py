"""A llama.cpp GGUF file (Llama or Qwen2 architecture) as a Hugging Face model directory.

We dequantize it once with the ``gguf`` package (seconds, unlike transformers'
``from_pretrained(gguf_file=...)``) into ``config.json`` + float32 ``model.safetensors``
+ tokenizer files; ``gguf_cache.py`` keeps the result, converted once across processes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

# GGUF (llama.cpp) tensor names -> HF Llama names: per layer (blk.N.*) and global.
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# GGUF architecture -> HF architecture. llama.cpp permutes q/k rows only for Llama (its rotary
# pairs adjacent rows); Qwen2 keeps HF's rotate-half layout and has q/k/v biases.
_ARCHS = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}
# Tensors llama.cpp adds that have no HF counterpart (derivable from the config).
_SKIPPED = ("rope_freqs.weight",)


# ------------------------------------------------------------------------ conversion


def convert_gguf(gguf_path: str, out_dir: str) -> None:
    """Write an HF Llama model dir (config, float32 safetensors, tokenizer) from a GGUF file."""
    import gguf
    from safetensors.torch import save_file

    start = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    reader = gguf.GGUFReader(gguf_path)  # parsing metadata is ~2 s, so do it once
    config, state_dict = _read_gguf(reader)
    save_file(state_dict, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    _write_json(os.path.join(out_dir, "config.json"), config)
    _write_json(os.path.join(out_dir, "generation_config.json"), _generation_config(config))
    _save_tokenizer(reader, gguf_path, out_dir)
    logger.info("Converted %s -> %s in %.1fs", gguf_path, out_dir, time.perf_counter() - start)


def _read_gguf(reader: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    import gguf
    from tqdm import tqdm

    config = _hf_config(reader)
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    permuted = config["model_type"] == "llama"
    state_dict: dict[str, torch.Tensor] = {}
    for t in tqdm(reader.tensors, desc="Dequantizing GGUF", unit="tensor"):
        name = _hf_name(t.name)
        if name is None:
            continue
        # GGUF lists dims fastest-first (ne order); numpy/torch want them reversed.
        shape = tuple(int(d) for d in reversed(t.shape))
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        if not permuted:
            pass
        elif name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
            w = _unpermute_rotary(w, n_head)
        elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
            w = _unpermute_rotary(w, n_kv)
        state_dict[name] = torch.from_numpy(np.array(w, dtype=np.float32, order="C"))
    config["tie_word_embeddings"] = "lm_head.weight" not in state_dict
    return config, state_dict


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    if gguf_name in _SKIPPED:
        logger.warning("Skipping GGUF tensor %s (no HF counterpart)", gguf_name)
        return None
    raise ValueError(f"Unknown GGUF tensor {gguf_name!r}: not a Llama or Qwen2 checkpoint?")


def _unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation back to HF's rotate-half layout.

    llama.cpp's converter maps each head's rows (2, hd/2) -> (hd/2, 2) so that
    rotary pairs are adjacent (GPT-J style); HF keeps the two halves apart.
    """
    rest = w.shape[1:]
    return w.reshape(n_head, -1, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _hf_config(reader: Any) -> dict[str, Any]:
    """Build a transformers Llama (or Qwen2) config dict from GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHS:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (only {sorted(_ARCHS)})")
    if any(k.startswith(f"{arch}.rope.scaling.") for k in reader.fields):
        logger.warning("GGUF declares rope scaling; it is not carried into config.json")

    def get(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    hidden, n_head = int(get("embedding_length")), int(get("attention.head_count"))
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    config = {
        "architectures": [_ARCHS[arch][0]],
        "model_type": _ARCHS[arch][1],
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(get("attention.head_count_kv", n_head)),
        "head_dim": int(get("attention.key_length", hidden // n_head)),
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "vocab_size": int(embd.shape[1]),
        "hidden_act": "silu",
        "attention_bias": arch == "qwen2",
        "mlp_bias": False,
        "tie_word_embeddings": True,  # overwritten from the tensors present
        "torch_dtype": "float32",
    }
    for key, hf_key in (("bos", "bos"), ("eos", "eos"), ("padding", "pad")):
        value = _field(reader, f"tokenizer.ggml.{key}_token_id", None)
        if value is not None:
            config[f"{hf_key}_token_id"] = int(value)
    return config


def _field(reader: Any, key: str, default: Any = KeyError) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is KeyError:
            raise KeyError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def _f32(x: float) -> float:
    """GGUF stores float32; keep its shortest repr so 1e-5 stays 1e-5, not 9.99999974e-06."""
    return float(str(np.float32(x)))


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {"_from_model_config": True, **{k: config[k] for k in keys if k in config}}


def _write_json(path: str, obj: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


# ------------------------------------------------------------------------- tokenizer


def _save_tokenizer(reader: Any, gguf_path: str, out_dir: str) -> None:
    """Build the fast tokenizer from GGUF metadata and save it with transformers.

    SmolLM2's (byte-level BPE, llama.cpp pre-tokenizer "smollm") is rebuilt directly from
    the already-parsed metadata: exact and ~5 s faster than transformers' GGUF importer,
    which would also drop the individual-digit pre-tokenizer. Other tokenizers go
    through that importer. The chat template is kept inside tokenizer_config.json (no
    side .jinja file) so readers that only look there still find it.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    model = _field(reader, "tokenizer.ggml.model", None)
    pre = _field(reader, "tokenizer.ggml.pre", None)
    if model == "gpt2" and pre == "smollm":
        tok = PreTrainedTokenizerFast(
            tokenizer_object=_smollm_tokenizer(reader), **_special_kwargs(reader)
        )
    else:
        logger.warning("GGUF tokenizer %r/%r: using transformers' GGUF importer", model, pre)
        gguf_dir, name = os.path.split(os.path.abspath(gguf_path))
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name)
    if tok.chat_template is None:
        logger.warning("GGUF has no tokenizer.chat_template; apply_chat_template will not work")
    tok.save_pretrained(out_dir, save_jinja_files=False)


def _smollm_tokenizer(reader: Any) -> Any:
    """SmolLM2's byte-level BPE: digits split one by one, then GPT-2 byte-level regex."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]
    types = _field(reader, "tokenizer.ggml.token_type")
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    # llama.cpp token types: 3 = control (special), 4 = user-defined (added, not special).
    tk.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    )
    tk.add_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types) if ty == 4])
    return tk


def _special_kwargs(reader: Any) -> dict[str, Any]:
    """tokenizer_config fields (special tokens, template, limits) from GGUF metadata."""
    tokens = _field(reader, "tokenizer.ggml.tokens")
    arch = _field(reader, "general.architecture")
    kwargs: dict[str, Any] = {
        "chat_template": _field(reader, "tokenizer.chat_template", None),
        "model_max_length": int(_field(reader, f"{arch}.context_length")),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
    }
    for key, hf_key in (("bos", "bos"), ("eos", "eos"), ("unknown", "unk"), ("padding", "pad")):
        idx = _field(reader, f"tokenizer.ggml.{key}_token_id", None)
        if idx is not None:
            kwargs[f"{hf_key}_token"] = tokens[idx]
    return kwargs
