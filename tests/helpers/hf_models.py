"""Tiny random Hugging Face checkpoints and transformers reference outputs.

Used by the test suite to check the engine's exactness against transformers
(float32, CPU).  Everything here works offline.

API
---
- ``ARCHS``: supported architecture names.
- ``make_tiny_checkpoint(arch, out_dir, ...)``: build + save a tiny random model.
- ``hf_model(path)``: cached float32 eval-mode transformers model.
- ``hf_prefill_logits(path, prompts)``: per-prompt logits ``[len, vocab]``.
- ``hf_greedy(path, prompts, max_new_tokens, eos_token_id=None)``: greedy tokens.
- ``greedy_margins(path, prompts, outputs)``: per-step top-1/top-2 logit gaps.
- ``random_prompts(n, lengths, vocab_size, seed)``: token ids in ``[3, vocab)``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import zlib
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the network

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig

ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "mistral")

BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2

_TF_VERSION = tuple(int(x) for x in transformers.__version__.split(".")[:2])
_TF_MAJOR = _TF_VERSION[0]
# `torch_dtype` was renamed `dtype` in transformers 4.56.
_DTYPE_KW = {"dtype" if _TF_VERSION >= (4, 56) else "torch_dtype": torch.float32}

# Llama-3 style RoPE scaling.  original_max_position_embeddings is small so the
# scaling really changes the frequencies of a head_dim-16 model.
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
_LLAMA_ROPE_THETA = 500000.0

# Init scales (std of the normal used for each parameter kind).  Chosen so the
# residual stream is not dominated by the embedding alone and the final logits
# have a std of ~12 (decisive greedy argmax).
_EMBED_STD = 1.0
_LINEAR_STD = 0.12
_LM_HEAD_STD = 1.5
_ROUTER_STD = 1.0
_NORM_STD = 0.1
_BIAS_STD = 0.1


def _config_class(arch: str):
    from transformers import (
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
    )

    return {
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
        "qwen3_moe": Qwen3MoeConfig,
        "mistral": MistralConfig,
    }[arch]


def _default_rope_theta(arch: str) -> float:
    if arch == "llama":
        return _LLAMA_ROPE_THETA
    return 1000000.0 if arch.startswith("qwen") else 10000.0


def _rope_kwargs(arch: str) -> dict[str, Any]:
    """RoPE kwargs in the spelling the installed transformers understands."""
    theta = _default_rope_theta(arch)
    scaling = dict(_LLAMA3_ROPE) if arch == "llama" else None
    if _TF_MAJOR >= 5:
        params: dict[str, Any] = dict(scaling) if scaling else {"rope_type": "default"}
        params["rope_theta"] = theta
        return {"rope_parameters": params}
    out: dict[str, Any] = {"rope_theta": theta}
    if scaling is not None:
        out["rope_scaling"] = scaling
    return out


def _build_config(
    arch: str,
    *,
    num_kv_heads: int,
    vocab_size: int,
    tie_word_embeddings: bool,
    overrides: dict[str, Any],
):
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    kwargs: dict[str, Any] = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_kv_heads,
        head_dim=16,
        vocab_size=vocab_size,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=BOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        tie_word_embeddings=tie_word_embeddings,
        hidden_act="silu",
    )
    kwargs.update(_rope_kwargs(arch))
    if arch == "qwen3_moe":
        kwargs.update(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if arch in ("qwen2", "qwen3", "qwen3_moe"):
        kwargs.update(use_sliding_window=False, sliding_window=None)
    if arch == "mistral":
        kwargs.update(sliding_window=None)
    if arch == "llama":
        kwargs.update(attention_bias=False, mlp_bias=False)
    overrides = dict(overrides)
    if _TF_MAJOR >= 5 and ("rope_theta" in overrides or "rope_scaling" in overrides):
        # Fold legacy RoPE spellings into rope_parameters (which wins in 5.x).
        rope = dict(overrides.pop("rope_parameters", kwargs["rope_parameters"]))
        if "rope_scaling" in overrides:
            theta = rope["rope_theta"]
            rope = dict(overrides.pop("rope_scaling") or {"rope_type": "default"})
            rope["rope_theta"] = theta
        if "rope_theta" in overrides:
            rope["rope_theta"] = overrides.pop("rope_theta")
        kwargs["rope_parameters"] = rope
    kwargs.update(overrides)
    cfg = _config_class(arch)(**kwargs)
    # Some config classes keep tie_word_embeddings only via PretrainedConfig.
    cfg.tie_word_embeddings = tie_word_embeddings
    return cfg


# Mixed into the perturbation seed, per arch.  Picked so that with the default
# seed=0 every arch has clear greedy top-1/top-2 margins (min >= 0.07 over
# random_prompts(4, [5, 17, 33, 60], 256, seed=0 and seed=1) x 24 steps).
_PERTURB_SALT = {"llama": 3, "qwen2": 8, "qwen3": 53, "qwen3_moe": 25, "mistral": 99}


def _perturb_seed(arch: str, seed: int) -> int:
    return zlib.crc32(f"{arch}:{seed}:{_PERTURB_SALT.get(arch, 0)}".encode())


def _named_randn(base_seed: int, name: str, shape) -> torch.Tensor:
    """Standard normal tensor determined by (base_seed, canonical tensor name)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{base_seed}:{name}".encode()))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)


def _param_std(name: str) -> tuple[float, float]:
    """(mean, std) of the perturbed value of parameter ``name``."""
    if "norm" in name:  # input/post_attention/final norm, q_norm, k_norm
        return 1.0, _NORM_STD
    if name.endswith(".bias"):
        return 0.0, _BIAS_STD
    if "embed_tokens" in name:
        return 0.0, _EMBED_STD
    if name.startswith("lm_head"):
        return 0.0, _LM_HEAD_STD
    if name.endswith("mlp.gate.weight"):  # MoE router: decisive top-k
        return 0.0, _ROUTER_STD
    return 0.0, _LINEAR_STD


def _canonical_randn(base_seed: int, name: str, shape) -> torch.Tensor:
    """Random values keyed by checkpoint tensor names.

    transformers 5 fuses MoE experts into 3-D ``experts.gate_up_proj``
    ``[E, 2I, H]`` / ``experts.down_proj`` ``[E, H, I]`` parameters while 4.x
    keeps ``experts.{e}.{gate,up,down}_proj.weight``; drawing per-expert
    tensors by their checkpoint name gives identical weights in both.
    """
    if len(shape) == 3 and name.endswith("experts.gate_up_proj"):
        prefix = name[: -len("gate_up_proj")]
        n_exp, two_i, hidden = shape
        half = two_i // 2
        return torch.stack(
            [
                torch.cat(
                    [
                        _named_randn(base_seed, f"{prefix}{e}.gate_proj.weight", (half, hidden)),
                        _named_randn(base_seed, f"{prefix}{e}.up_proj.weight", (half, hidden)),
                    ]
                )
                for e in range(n_exp)
            ]
        )
    if len(shape) == 3 and name.endswith("experts.down_proj"):
        prefix = name[: -len("down_proj")]
        return torch.stack(
            [_named_randn(base_seed, f"{prefix}{e}.down_proj.weight", shape[1:])
             for e in range(shape[0])]
        )
    return _named_randn(base_seed, name, shape)


@torch.no_grad()
def _perturb_parameters(model: torch.nn.Module, seed: int) -> None:
    """Give every parameter a non-default random value.

    transformers initialises norm weights to 1 and biases to 0, which would
    hide a dropped weight in the engine; perturb them all.  Values depend only
    on (seed, tensor name), not on parameter order or transformers version.
    """
    for name, p in model.named_parameters():  # tied params appear once
        mean, std = _param_std(name)
        p.copy_((mean + std * _canonical_randn(seed, name, p.shape)).to(p.dtype))


def _augment_config_json(path: Path, arch: str, cfg) -> None:
    """Write both config spellings (transformers 4.x and 5.x) to config.json.

    transformers 5 only writes ``rope_parameters`` (and ``num_local_experts``
    for Qwen3-MoE); real hub checkpoints and transformers 4.x use
    ``rope_theta``/``rope_scaling`` (and ``num_experts``).  Keeping both makes
    the checkpoint readable by either version and by loaders that only know
    one of the spellings.
    """
    cfg_path = path / "config.json"
    data = json.loads(cfg_path.read_text())
    rope_params = data.get("rope_parameters")
    if rope_params is None and "rope_theta" in data:  # transformers 4.x wrote it
        rope_params = dict(data.get("rope_scaling") or {"rope_type": "default"})
        rope_params["rope_theta"] = data["rope_theta"]
        data["rope_parameters"] = rope_params
    if isinstance(rope_params, dict):
        if "rope_theta" in rope_params:
            data.setdefault("rope_theta", rope_params["rope_theta"])
        scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if scaling.get("rope_type", "default") == "default":
            data.setdefault("rope_scaling", None)
        else:
            data.setdefault("rope_scaling", scaling)
    if arch == "qwen3_moe":
        n = data.get("num_experts", data.get("num_local_experts"))
        if n is not None:
            data.setdefault("num_experts", n)
            data.setdefault("num_local_experts", n)
    cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def make_tiny_checkpoint(
    arch: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    num_kv_heads: int = 2,
    vocab_size: int = 256,
    tie_word_embeddings: bool = False,
    **overrides: Any,
) -> Path:
    """Build a tiny random ``arch`` model and save it (safetensors) to ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _build_config(
        arch,
        num_kv_heads=num_kv_heads,
        vocab_size=vocab_size,
        tie_word_embeddings=tie_word_embeddings,
        overrides=overrides,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, **_DTYPE_KW)
    model = model.to(torch.float32).eval()
    _perturb_parameters(model, _perturb_seed(arch, seed))
    if tie_word_embeddings:
        model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    _augment_config_json(out, arch, cfg)
    gen_cfg = {
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "do_sample": False,
    }
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    return out


@contextlib.contextmanager
def _one_thread():
    """Run tiny reference models single-threaded.

    For these tiny matmuls intra-op threading only adds overhead, and on a
    busy machine OpenMP spin-waiting made them ~40x slower.
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@functools.lru_cache(maxsize=None)
def _load(path: str) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, **_DTYPE_KW)
    return model.to(torch.float32).eval()


def hf_model(path: str | Path) -> torch.nn.Module:
    """Load the checkpoint at ``path`` (float32, eval), cached per path."""
    return _load(str(Path(path)))


@torch.no_grad()
def hf_prefill_logits(
    path: str | Path, prompts: list[list[int]], dtype: torch.dtype | None = None,
    device: str = "cpu",
) -> list[torch.Tensor]:
    """Logits of every position (``[len, vocab]``, float32, on CPU) for each prompt.

    Each prompt runs alone (no padding). ``dtype``/``device``: run a copy of the float32 model
    there (e.g. bfloat16 on CUDA, to measure transformers' own rounding error).
    """
    model = hf_model(path)
    if dtype is not None or device != "cpu":
        import copy

        model = copy.deepcopy(model).to(device=device, dtype=dtype or torch.float32)
    out = []
    with _one_thread():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
            logits = model(input_ids=ids, use_cache=False).logits[0]
            out.append(logits.float().cpu())
    return out


@torch.no_grad()
def hf_greedy(
    path: str | Path,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_token_id: int | None = None,
) -> list[list[int]]:
    """Greedy continuation of each prompt (run alone, no padding).

    With ``eos_token_id=None`` exactly ``max_new_tokens`` tokens are produced
    and EOS is an ordinary token (no stopping, no EOS suppression).  With an
    ``eos_token_id`` generation stops after emitting it; the EOS token is
    included in the returned list.  Only the new tokens are returned.
    """
    model = hf_model(path)
    gen_cfg = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id if eos_token_id is not None else 0,
        bos_token_id=BOS_TOKEN_ID,
        use_cache=True,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    # generate() fills unset (None) fields of the passed config from
    # model.generation_config -- which carries eos_token_id=2.  Swap in our
    # config for the duration so EOS really is ignored when asked.
    saved = model.generation_config
    model.generation_config = gen_cfg
    results = []
    try:
        with _one_thread():
            for prompt in prompts:
                ids = torch.tensor([list(prompt)], dtype=torch.long)
                seq = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    generation_config=gen_cfg,
                )
                new = seq[0, ids.shape[1] :].tolist()
                if eos_token_id is None:
                    assert len(new) == max_new_tokens, (len(new), max_new_tokens)
                results.append(new)
    finally:
        model.generation_config = saved
    return results


@torch.no_grad()
def greedy_margins(
    path: str | Path, prompts: list[list[int]], outputs: list[list[int]]
) -> list[torch.Tensor]:
    """Per-step top-1 minus top-2 logit gap of the reference model.

    For prompt i and generated tokens ``outputs[i]`` returns a float tensor
    ``[len(outputs[i])]``: the gap at the position that produced each token
    (computed by one full no-cache forward over prompt + outputs).  Useful to
    tell real mismatches from near-ties when comparing greedy outputs.
    """
    out = []
    for prompt, gen in zip(prompts, outputs):
        if not gen:
            out.append(torch.empty(0))
            continue
        logits = hf_prefill_logits(path, [list(prompt) + list(gen)[:-1]])[0]
        step = logits[len(prompt) - 1 :]
        top2 = step.topk(2, dim=-1).values
        out.append(top2[:, 0] - top2[:, 1])
    return out


def random_prompts(n: int, lengths: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    """``n`` random prompts; prompt i has length ``lengths[i % len(lengths)]``.

    Token ids are in ``[3, vocab_size)`` (0, 1, 2 are pad/bos/eos).
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = lengths[i % len(lengths)]
        out.append(torch.randint(3, vocab_size, (length,), generator=gen).tolist())
    return out
