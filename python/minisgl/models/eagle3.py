"""EAGLE-3 draft models: the ``LlamaForCausalLMEagle3`` checkpoints SGLang and vLLM load, the
draft of the ``eagle3`` speculative method (``speculative/eagle3.py``).

The target hands over, per position p, the residual streams leaving a few of its layers
(``BaseLLMModel.capture_aux``), concatenated: ``aux[p]``. One decoder layer predicts the token at
p + 2 from them and the token at p + 1::

    g   = fc(aux[p])        (a chained step: g = the previous step's ``out``, no fc)
    x   = [input_layernorm(embed(token[p + 1])) | hidden_norm(g)]                    [2 * H]
    a   = g + o_proj(attention(q, k, v of x; RoPE at position p))     causal over the draft's K/V
    out = a + mlp(post_attention_layernorm(a))      the pre-norm output: the next step's g
    logits = lm_head(norm(out))     over the draft vocabulary; draft id i is target id i + d2t[i]

(``norm_before_residual``, vLLM's option: the residual is ``hidden_norm(g)`` instead of g.) The
embedding is the checkpoint's ``embed_tokens`` when it has one, else the target's; the LM head is
the checkpoint's ``lm_head``, or the target's when the draft predicts over the whole vocabulary
and has none. The draft is small and replicated on every TP rank: plain torch modules. Its
attention is a KV layer of the engine's paged pool after the target's (``kv_layer``, the model's
``CacheSpec.draft``), attended by the engine's backend in a batch the proposer builds
(``speculative/head.py``). Its ``config.json``, and which target layers it reads, are
``eagle3_config.py``'s.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from minisgl.kvcache.spec import AttentionSpec
from minisgl.layers import RMSNorm
from minisgl.layers.rotary import RotaryEmbedding

from .eagle3_config import FIELD, Eagle3Config, read_config
from .names import CheckpointNames

if TYPE_CHECKING:
    from minisgl.context import Context

# ``model.`` prefixes dropped; ``layers.0.`` (vLLM's name of the midlayer) is ``midlayer.``
NAMES = CheckpointNames({}, prefixes=(("model.layers.0.", "midlayer."), ("layers.0.", "midlayer."),
                                      ("model.", "")))


class Eagle3Layer(nn.Module):
    """``midlayer``: a Llama decoder layer whose q/k/v read ``2 * hidden`` features, its K/V on
    KV layer ``kv_layer`` of the pool."""

    def __init__(self, cfg: Eagle3Config, kv_layer: int) -> None:
        super().__init__()
        h, d, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.cfg = cfg
        self.spec = AttentionSpec(kv_layer=kv_layer, num_qo_heads=cfg.num_heads,
                                  num_kv_heads=cfg.num_kv_heads, head_dim=d, scale=d ** -0.5,
                                  rotary=cfg.rotary)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, cfg.num_heads * d, bias=bias)
        self.self_attn.k_proj = nn.Linear(2 * h, cfg.num_kv_heads * d, bias=bias)
        self.self_attn.v_proj = nn.Linear(2 * h, cfg.num_kv_heads * d, bias=bias)
        self.self_attn.o_proj = nn.Linear(cfg.num_heads * d, h, bias=bias)
        self.mlp = nn.Module()
        inter, bias = cfg.intermediate_size, cfg.mlp_bias
        self.mlp.gate_proj = nn.Linear(h, inter, bias=bias)
        self.mlp.up_proj = nn.Linear(h, inter, bias=bias)
        self.mlp.down_proj = nn.Linear(inter, h, bias=bias)
        self.input_layernorm = RMSNorm(h, cfg.eps)
        self.hidden_norm = RMSNorm(h, cfg.eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.eps)
        self.rotary = RotaryEmbedding(cfg.rotary)

    def forward(self, embeds: torch.Tensor, g: torch.Tensor, positions: torch.Tensor,
                ctx: Context) -> torch.Tensor:
        """``embeds``, ``g`` ``[T, H]`` at ``positions``, the batch bound to ``ctx``: stores the
        K/V at its ``out_loc`` and returns out ``[T, H]``."""
        cfg, attn, t = self.cfg, self.self_attn, embeds.shape[0]
        normed = self.hidden_norm(g)
        residual = normed if cfg.norm_before_residual else g
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        q = attn.q_proj(x).view(t, cfg.num_heads, cfg.head_dim)
        k = attn.k_proj(x).view(t, cfg.num_kv_heads, cfg.head_dim)
        v = attn.v_proj(x).view(t, cfg.num_kv_heads, cfg.head_dim)
        q, k = self.rotary(positions, q, k)
        ctx.kv_pool.store_kv(k, v, self.spec.out_loc(ctx.batch), self.spec.kv_layer)
        out = ctx.attn_backend.forward(q, k, v, self.spec, ctx.batch).reshape(t, -1)
        a = residual + attn.o_proj(out)
        h = self.post_attention_layernorm(a)
        return a + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class Eagle3Draft(nn.Module):
    """The checkpoint's tensors by their own names (``midlayer.``, ``fc``, ``norm``, ``lm_head``,
    ``d2t``, maybe ``embed_tokens``). ``embed_tokens`` / ``lm_head`` are None where the target's
    serve (the proposer then calls the target's)."""

    def __init__(self, cfg: Eagle3Config, own_embed: bool, own_head: bool,
                 kv_layer: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(len(cfg.aux_layers) * cfg.target_hidden_size, h, bias=cfg.fc_bias)
        self.midlayer = Eagle3Layer(cfg, kv_layer)
        self.spec = self.midlayer.spec
        self.norm = RMSNorm(h, cfg.eps)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if own_embed else None
        self.lm_head = None
        if own_head:
            self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
            if cfg.tie_word_embeddings and self.embed_tokens is not None:
                self.lm_head.weight = self.embed_tokens.weight
        # target id of draft id i: i + d2t[i]
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                ctx: Context, from_target: bool) -> torch.Tensor:
        """``hidden``: the target's concatenated aux states (``from_target``) or the previous
        step's output. Returns out, the pre-norm output (``Eagle3Layer.forward``)."""
        g = self.fc(hidden) if from_target else hidden
        return self.midlayer(embeds, g, positions, ctx)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


def load_eagle3(path: str, target, dtype: torch.dtype, device: torch.device,
                dummy: bool = False, seed: int = 0) -> Eagle3Draft:
    """The draft of ``path`` for ``target`` (a loaded ``BaseLLMModel``); ``dummy``: random
    weights from the config alone (timing without a checkpoint)."""
    cfg = read_config(path, target.cfg)
    tensors = _random_tensors(cfg, seed) if dummy else _read_tensors(path)
    tensors = {_our_name(k): v for k, v in tensors.items() if not k.endswith("t2d")}
    own_embed = "embed_tokens.weight" in tensors
    if cfg.tie_word_embeddings and own_embed:  # the LM head is the embedding
        tensors.pop("lm_head.weight", None)
    own_head = "lm_head.weight" in tensors or (cfg.tie_word_embeddings and own_embed)
    if not own_embed and cfg.hidden_size != target.cfg.hidden_size:
        raise ValueError(f"hidden_size: the draft has no embed_tokens and its {cfg.hidden_size} "
                         f"features are not the target's {target.cfg.hidden_size}")
    if not own_head and (cfg.draft_vocab_size != cfg.vocab_size
                         or cfg.hidden_size != target.cfg.hidden_size):
        raise ValueError(f"{FIELD}: lm_head.weight is missing (the target's LM head serves only "
                         "a draft of the target's vocabulary and hidden size)")
    with torch.device(device):  # its K/V: the pool's layer after the target's
        draft = Eagle3Draft(cfg, own_embed, own_head, target.cache_spec().num_kv_layers)
    draft = draft.to(dtype).eval()
    params = dict(draft.named_parameters()) | dict(draft.named_buffers())
    loaded = set()
    for name, tensor in tensors.items():
        if name not in params:
            raise ValueError(f"{FIELD}: checkpoint tensor {name!r} matches no parameter of the "
                             "EAGLE-3 draft")
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise ValueError(f"{FIELD}: {name} has shape {tuple(tensor.shape)}, the draft's "
                             f"config makes it {tuple(params[name].shape)}")
        params[name].data.copy_(tensor.to(params[name].dtype))
        loaded.add(name)
    if "lm_head.weight" not in tensors and own_head:  # tied to embed_tokens
        loaded.add("lm_head.weight")
    if "d2t" not in loaded and cfg.draft_vocab_size == cfg.vocab_size:
        loaded.add("d2t")  # the identity
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"{FIELD}: the checkpoint lacks {', '.join(missing)}")
    ids = draft.to_target(torch.arange(cfg.draft_vocab_size, device=device))
    if int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size:
        raise ValueError(f"d2t: maps draft ids outside the target vocabulary of {cfg.vocab_size}")
    return draft


def _our_name(name: str) -> str:
    return (NAMES.map(name) or (name, None))[0]  # the table skips nothing


def _read_tensors(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the draft's safetensors files, else of its ``pytorch_model.bin`` (read
    with ``weights_only``: no code in a pickle runs)."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        from safetensors.torch import load_file

        return {k: v for f in files for k, v in load_file(f).items()}
    files = sorted(glob.glob(os.path.join(path, "*.bin")))
    if not files:
        raise ValueError(f"{FIELD}: no *.safetensors or *.bin weights in {path!r}")
    return {k: v for f in files
            for k, v in torch.load(f, map_location="cpu", weights_only=True).items()}


def _random_tensors(cfg: Eagle3Config, seed: int) -> dict[str, torch.Tensor]:
    """Random weights of every parameter; the embedding is the target's where the hidden sizes
    agree, and ``d2t`` the identity (the first draft_vocab_size target ids)."""
    gen = torch.Generator().manual_seed(seed)
    own_embed = cfg.hidden_size != cfg.target_hidden_size
    with torch.device("meta"):
        shapes = Eagle3Draft(cfg, own_embed=own_embed, own_head=True)
    out = {"d2t": torch.zeros(cfg.draft_vocab_size, dtype=torch.long)}
    for name, p in shapes.named_parameters():
        noise = torch.randn(p.shape, generator=gen) * 0.02
        out[name] = noise + 1 if name.endswith("norm.weight") else noise
    return out
