"""What every decoder-only model file shares: the embedding -> layers -> norm -> LM head skeleton,
the checkpoint-name mapping onto merged projections, and the weight-loading loop.

A family subclasses ``BaseLLMModel``, says how to build its decoder layer (``make_layer``) and
parses its config (``parse_config``); see ``llama.py``. Quantization never appears here or in a
model file: the layers get ``cfg.quant`` and ask its methods (``minisgl.quant``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Iterable

import torch
from torch import nn

from minisgl.distributed import DistributedCommunicator
from minisgl.kvcache.spec import AttentionSpec, CacheSpec
from minisgl.layers import ParallelLMHead, RMSNorm, VocabParallelEmbedding
from minisgl.layers.base import copy_weight, materialize
from minisgl.layers.moe import MoELayer
from minisgl.moe import BaseMoeBackend

from .config import ModelConfig, common_fields
from .names import CheckpointNames

if TYPE_CHECKING:
    from minisgl.context import Context

    from .eagle3 import Eagle3Draft

# per-layer FP8 KV-cache scales (``layers.N.self_attn.k_scale``), kept for the KV pool
_KV_SCALE = re.compile(r"layers\.(\d+)\.self_attn\.(?:attn\.)?([kv])_scale$")
_WIDE = (torch.bfloat16, torch.float16, torch.float32)  # unquantized checkpoint dtypes
_LAYER = re.compile(r"layers\.(\d+)\.")  # our name of a decoder layer's parameter


def with_images(x: torch.Tensor, ctx: Context) -> torch.Tensor:
    """The token embeddings ``x`` with the rows of the batch's image tokens replaced by the
    vision tower's output (``core.BatchImages``; as transformers' ``masked_scatter``, after any
    scaling of the text embeddings)."""
    images = ctx.batch.images
    if images is None or images.rows.numel() == 0:
        return x
    return x.index_copy(0, images.rows, images.embeds.to(x.dtype))


def weight_bytes(model: nn.Module) -> int:
    """Device bytes of ``model``'s weights: its parameters, and the experts a MoE backend keeps
    in layouts of its own (``MoELayer.layout_bytes``)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return params + sum(m.layout_bytes for m in model.modules() if isinstance(m, MoELayer))


class BaseLLMModel(nn.Module):
    """``forward(input_ids, positions, ctx)`` returns the hidden states of every computed token;
    ``compute_logits`` projects only the rows that are sampled. A decoder layer is called as
    ``layer(x, residual, positions, ctx) -> (x, residual)`` and may offer ``fuse_norms()``,
    called once after loading, before the weights are processed."""

    # the family's RMSNorm variant (``layers/norm.py``): ``RMSNorm(size, eps, **norm_options)``
    norm_options: ClassVar[dict[str, Any]] = {}
    # the family's checkpoint names (``names.py``); Llama's by default
    names: CheckpointNames = CheckpointNames()

    def __init__(self, cfg: ModelConfig, comm: DistributedCommunicator, moe: BaseMoeBackend):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, comm)
        self.layers = nn.ModuleList(
            self.make_layer(cfg, i, comm, moe) for i in range(cfg.num_layers)
        )
        self.norm = self.make_norm(cfg.hidden_size)
        tied = self.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, comm, tied=tied,
                                      quant=cfg.quant)

    @classmethod
    def parse_config(cls, raw: dict[str, Any]) -> ModelConfig:
        """This family's ``ModelConfig`` from a ``config.json`` dict."""
        return ModelConfig(**common_fields(raw))

    def make_norm(self, size: int) -> RMSNorm:
        return RMSNorm(size, self.cfg.rms_norm_eps, **self.norm_options)

    def make_layer(self, cfg: ModelConfig, layer_id: int, comm: DistributedCommunicator,
                   moe: BaseMoeBackend) -> nn.Module:
        raise NotImplementedError

    # EAGLE-3 (``capture_aux``): the layers after which ``forward`` also returns the residual
    # stream; empty: plain hidden states
    aux_layers: tuple[int, ...] = ()
    # a speculative draft head's attention (MTP, EAGLE-3): the last KV layer of the pool
    draft_attention: AttentionSpec | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                ctx: Context) -> torch.Tensor:
        x, residual = with_images(self.embed_tokens(input_ids), ctx), None
        aux: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, positions, ctx)
            if i in self.aux_layers:  # the stream after layer i: what layer i + 1 adds to
                aux.append(x if residual is None else x + residual)
        hidden = self.norm.add_norm(x, residual)[0]
        return torch.cat([hidden, *aux], -1) if aux else hidden

    def capture_aux(self, layers: tuple[int, ...]) -> None:
        """EAGLE-3's target side: from now on every ``forward`` row is the hidden state followed
        by the residual stream (after the residual add) that leaves each of ``layers``, in layer
        order: ``[T, H * (1 + len(layers))]``; ``split_aux`` takes it apart. One wide tensor,
        so the piecewise CUDA graphs keep it in their static output as they keep the hidden
        states. A family with its own ``forward`` cannot capture."""
        if type(self).forward is not BaseLLMModel.forward:
            raise ValueError(f"speculative_config: method 'eagle3' needs a target whose decoder "
                             f"loop is the shared one; {self.cfg.architecture} has its own")
        bad = [i for i in layers if not 0 <= i < len(self.layers)]
        if bad or len(set(layers)) != len(layers):
            raise ValueError(f"eagle_aux_hidden_state_layer_ids: {list(layers)} must be distinct "
                             f"layers of the target's {len(self.layers)}")
        self.aux_layers = tuple(sorted(layers))

    def add_eagle3(self, draft: Eagle3Draft) -> None:
        """Attach an EAGLE-3 draft (``eagle3.load_eagle3``, its attention on the pool's KV layer
        after this model's): capture the layers it reads, and declare its K/V."""
        self.capture_aux(draft.cfg.aux_layers)
        self.eagle3 = draft
        self.draft_attention = draft.spec

    def split_aux(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward``'s rows -> (hidden states, captured streams or None): views, no copy."""
        if not self.aux_layers:
            return hidden, None
        h = self.cfg.hidden_size
        return hidden[:, :h], hidden[:, h:]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def cache_spec(self) -> CacheSpec:
        """The caches this model needs (``kvcache/spec.py``): by default every layer's
        ``self_attn.spec``; a family with other caches (recurrent state) overrides this."""
        return CacheSpec(tuple(layer.self_attn.spec for layer in self.layers),
                         draft=self.draft_attention)

    def checkpoint_names(self, name: str) -> tuple[str, object] | None:
        """Map a Hugging Face tensor name to (our parameter, shard id) through the family's
        ``names``; None to skip it (a tied LM head, RoPE's cached frequencies)."""
        if "rotary_emb.inv_freq" in name:
            return None
        mapped = self.names.map(name)
        if mapped is None or (mapped[0].startswith("lm_head.") and self.cfg.tie_word_embeddings):
            return None
        return mapped

    def expand_tensor(self, name: str, tensor: Any) -> Iterable[tuple[str, Any]]:
        """The tensors one checkpoint tensor loads as (a family whose checkpoint stacks what the
        loaders take one by one splits it here); by default itself."""
        return ((name, tensor),)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Load every tensor into its parameter; each decoder layer's norm fusions, then each of
        its modules' ``process_weights_after_loading`` (online quantization); then the same for
        the rest of the model. Per-layer KV-cache scales land in ``self.kv_scales``
        ({layer: {"k": s, "v": s}}) for the KV pool.

        When ``weights`` names its tensors up front (``models.weight.WeightStream``), a layer is
        processed as soon as its last tensor arrived, so weights quantized at load (created
        deferred: no storage before their first tensor) are unquantized one layer at a time,
        never the whole model; otherwise every layer is processed at the end."""
        params = dict(self.named_parameters())
        expected, loaded = set(params), set()
        self.kv_scales: dict[int, dict[str, float]] = {}
        remaining = self._tensors_per_layer(getattr(weights, "names", None))
        for ckpt_name, tensor in weights:
            layer = self._layer_of(ckpt_name)
            if layer is not None and remaining.get(layer) == 0:
                raise ValueError(f"checkpoint tensor {ckpt_name!r} arrived after its layer was "
                                 "complete and processed (a name listed twice?)")
            for name, part in self.expand_tensor(ckpt_name, tensor):
                self._load_tensor(name, part, params, loaded, ckpt_name)
            if layer is not None and remaining.get(layer):
                remaining[layer] -= 1
                if remaining[layer] == 0:
                    self._process_layer(layer, params)
        missing = expected - loaded
        if missing:
            raise ValueError(f"checkpoint lacks weights for: {', '.join(sorted(missing)[:8])}")
        for i in range(len(self.layers)):
            if remaining.get(i) != 0:
                self._process_layer(i, params)
        for module in self.modules():  # idempotent for the layers done above
            if hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading()

    def _load_tensor(self, ckpt_name: str, tensor: Any, params: dict[str, nn.Parameter],
                     loaded: set[str], source: str) -> None:
        kv_scale = _KV_SCALE.search(ckpt_name)
        if kv_scale:
            value = tensor.load() if hasattr(tensor, "load") else tensor
            self.kv_scales.setdefault(int(kv_scale.group(1)), {})[kv_scale.group(2)] = \
                float(value.float().reshape(-1)[0])
            return
        mapped = self.checkpoint_names(ckpt_name)
        if mapped is None:
            return
        name, shard_id = mapped
        if name not in params:
            raise ValueError(f"checkpoint tensor {source!r} matches no parameter of the model")
        param = params[name]
        if param.dtype == torch.float8_e4m3fn and getattr(tensor, "dtype", None) in _WIDE:
            raise ValueError(
                f"checkpoint tensor {source!r} is {tensor.dtype}, where the model holds FP8 with "
                "block scales (weight_scale_inv): a projection the checkpoint leaves unquantized "
                "(quantization_config.modules_to_not_convert) that minisgl quantizes")
        materialize(param)
        tensor = tensor.to(param.dtype)
        loader = getattr(param, "weight_loader", None)
        try:
            if loader is not None:
                loader(param, tensor, shard_id)
            else:
                copy_weight(param, tensor)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
        loaded.add(name)

    def _layer_of(self, ckpt_name: str) -> int | None:
        """The decoder layer a checkpoint tensor loads into, or None (embeddings, head, skipped
        tensors)."""
        mapped = self.checkpoint_names(ckpt_name)
        match = _LAYER.match(mapped[0]) if mapped is not None else None
        return int(match.group(1)) if match else None

    def _tensors_per_layer(self, names: Iterable[str] | None) -> dict[int, int]:
        counts: dict[int, int] = {}
        for name in names or ():
            layer = self._layer_of(name)
            if layer is not None:
                counts[layer] = counts.get(layer, 0) + 1
        return counts

    def _process_layer(self, i: int, params: dict[str, nn.Parameter]) -> None:
        """Fuse and process decoder layer ``i``; forget its parameters (a quantized weight
        replaces its unquantized one, which is freed once nothing refers to it)."""
        layer = self.layers[i]
        if hasattr(layer, "fuse_norms"):
            layer.fuse_norms()
        for module in layer.modules():
            if hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading()
        for name in [n for n in params if n.startswith(f"layers.{i}.")]:
            del params[name]
