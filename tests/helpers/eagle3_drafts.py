"""Random EAGLE-3 draft checkpoints in the layout SGLang and vLLM load, and the draft's
computation in plain torch from a checkpoint's tensors (the reference ``models/eagle3.py`` is
tested against)."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

VOCAB, DRAFT_VOCAB, HEADS, KV_HEADS, HEAD_DIM = 256, 96, 4, 2, 16


def make_draft(out, target, *, seed: int = 0, hidden: int = 64, own_embed: bool = False,
               config: dict | None = None, heads=(HEADS, KV_HEADS, HEAD_DIM),
               vocab=(VOCAB, DRAFT_VOCAB)):
    """A random EAGLE-3 draft for ``target``: every tensor random (norms around 1), a ``d2t``
    onto a random subset of the target's vocabulary, ``t2d`` beside it. ``heads``: query heads,
    KV heads, head size; ``vocab``: the target's and the draft's."""
    (n_heads, n_kv, head_dim), (n_vocab, n_draft) = heads, vocab
    out.mkdir(parents=True, exist_ok=True)
    raw = json.loads((target / "config.json").read_text())
    th = (raw.get("text_config") or raw)["hidden_size"]
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.15):
        return torch.randn(*shape, generator=gen) * scale

    m = "midlayer."
    w = {"fc.weight": r(hidden, 3 * th, scale=0.1),
         m + "self_attn.q_proj.weight": r(n_heads * head_dim, 2 * hidden),
         m + "self_attn.k_proj.weight": r(n_kv * head_dim, 2 * hidden),
         m + "self_attn.v_proj.weight": r(n_kv * head_dim, 2 * hidden),
         m + "self_attn.o_proj.weight": r(hidden, n_heads * head_dim),
         m + "mlp.gate_proj.weight": r(96, hidden), m + "mlp.up_proj.weight": r(96, hidden),
         m + "mlp.down_proj.weight": r(hidden, 96), "lm_head.weight": r(n_draft, hidden)}
    for name in (m + "input_layernorm", m + "hidden_norm", m + "post_attention_layernorm",
                 "norm"):
        w[name + ".weight"] = 1 + r(hidden, scale=0.2)
    if own_embed:
        w["embed_tokens.weight"] = r(n_vocab, hidden, scale=1.0)
    chosen = torch.randperm(n_vocab, generator=gen)[:n_draft].sort().values
    w["d2t"] = chosen - torch.arange(n_draft)
    w["t2d"] = torch.zeros(n_vocab, dtype=torch.bool).index_fill_(0, chosen, True)
    save_file(w, str(out / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
           "hidden_size": hidden, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
           "head_dim": HEAD_DIM, "intermediate_size": 96, "num_hidden_layers": 1,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
           "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": th,
           "tie_word_embeddings": False,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}, **(config or {})}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def make_echo_draft(out, target):
    """A draft that repeats the target's last prediction: ``fc`` passes the last layer's output
    through, the midlayer adds nothing (zero o/down projections), the final norm and LM head are
    the target's (its rows of the draft vocabulary). Repetitions in the output get accepted, so
    multi-token accepted runs are exercised."""
    layers = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 3]}}
    make_draft(out, target, seed=2, config=layers)
    w, t = load_file(str(out / "model.safetensors")), load_file(str(target / "model.safetensors"))
    h = t["model.norm.weight"].shape[0]
    w["fc.weight"] = torch.cat([torch.zeros(h, 2 * h), torch.eye(h)], 1)
    w["midlayer.self_attn.o_proj.weight"].zero_()
    w["midlayer.mlp.down_proj.weight"].zero_()
    w["norm.weight"] = t["model.norm.weight"]
    w["lm_head.weight"] = t["lm_head.weight"][torch.arange(DRAFT_VOCAB) + w["d2t"]]
    save_file(w, str(out / "model.safetensors"))
    return out


def _norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def reference_step(w: dict, embeds, g, pos, past_k, past_v):
    """The EAGLE-3 midlayer in plain torch from the checkpoint's tensors: (pre-norm out, k, v)."""
    m, t = "midlayer.", g.shape[0]
    x = torch.cat([_norm(embeds, w[m + "input_layernorm.weight"]),
                   _norm(g, w[m + "hidden_norm.weight"])], -1)
    q = _rope((x @ w[m + "self_attn.q_proj.weight"].T).view(t, HEADS, HEAD_DIM), pos)
    k = _rope((x @ w[m + "self_attn.k_proj.weight"].T).view(t, KV_HEADS, HEAD_DIM), pos)
    v = (x @ w[m + "self_attn.v_proj.weight"].T).view(t, KV_HEADS, HEAD_DIM)
    keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
    p, group = past_k.shape[0], HEADS // KV_HEADS
    out = torch.empty(t, HEADS, HEAD_DIM)
    for i in range(t):
        for head in range(HEADS):
            kk, vv = keys[: p + i + 1, head // group], values[: p + i + 1, head // group]
            out[i, head] = torch.softmax(kk @ q[i, head] / HEAD_DIM ** 0.5, 0) @ vv
    a = g + out.reshape(t, -1) @ w[m + "self_attn.o_proj.weight"].T
    h = _norm(a, w[m + "post_attention_layernorm.weight"])
    mlp = (F.silu(h @ w[m + "mlp.gate_proj.weight"].T) * (h @ w[m + "mlp.up_proj.weight"].T)) \
        @ w[m + "mlp.down_proj.weight"].T
    return a + mlp, k, v


def reference_logits(w: dict, out):
    """The draft-vocabulary logits of pre-norm outputs ``out``."""
    return _norm(out, w["norm.weight"]) @ w["lm_head.weight"].T


def reference_drafts(w: dict, embed, aux, ids: list[int], k: int) -> list[int]:
    """k drafts after ``ids`` from the target's aux rows of positions 0 .. n-2: the whole history
    at once, then a chain on the pre-norm output; draft ids mapped through ``d2t``."""
    n = len(ids)
    out, keys, values = reference_step(w, embed[ids[1:]], aux[: n - 1] @ w["fc.weight"].T,
                                       torch.arange(n - 1), torch.empty(0, KV_HEADS, HEAD_DIM),
                                       torch.empty(0, KV_HEADS, HEAD_DIM))
    last, drafts = out[-1:], []
    for j in range(k):
        d = int(reference_logits(w, last)[0].argmax())
        drafts.append(d + int(w["d2t"][d]))
        if j < k - 1:
            last, kk, vv = reference_step(w, embed[[drafts[-1]]], last, torch.tensor([n - 1 + j]),
                                          keys, values)
            keys, values = torch.cat([keys, kk]), torch.cat([values, vv])
    return drafts


def make_checkpoints(root, names=("llama", "qwen2", "qwen3", "llama_echo")) -> dict:
    """(target, draft) by name: llama's draft uses the target's embedding and SGLang's layer ids
    (outputs of layers 0, 1, 2); qwen2's likewise; qwen3's is narrower than its target with an
    embedding of its own, vLLM's top-level ids (inputs of layers 1, 2 and of the final norm:
    outputs of 0, 1, 3) and a context shorter than the requests; llama_echo is
    ``make_echo_draft``'s. Targets of four layers, so three distinct aux layers exist."""
    from helpers.hf_models import make_tiny_checkpoint

    targets = {arch: make_tiny_checkpoint(arch, root / arch, num_hidden_layers=4)
               for arch in {name.removesuffix("_echo") for name in names}}
    top = {"eagle_config": {}, "eagle_aux_hidden_state_layer_ids": [1, 2, 4],
           "max_position_embeddings": 64}  # shorter than the requests: RoPE goes on
    builders = {
        "llama": lambda: make_draft(root / "llama_draft", targets["llama"]),
        "qwen2": lambda: make_draft(root / "qwen2_draft", targets["qwen2"], seed=4),
        "qwen3": lambda: make_draft(root / "qwen3_draft", targets["qwen3"], seed=1, hidden=48,
                                    own_embed=True, config=top),
        "llama_echo": lambda: make_echo_draft(root / "llama_echo", targets["llama"])}
    return {name: (targets[name.removesuffix("_echo")], builders[name]()) for name in names}


def eagle3_spec(draft, k: int = 3) -> dict:
    """The ``speculative_config`` of ``draft``, drafting k tokens whatever the acceptance."""
    return {"method": "eagle3", "model": str(draft), "num_speculative_tokens": k,
            "adaptive": False}
