"""Where weights come from: a local HF directory, a Hugging Face repo id, a ``.gguf`` file, or
random.

Everything is turned into a local directory with ``config.json`` (``resolve_model_path``) and then
streamed tensor by tensor into the model, each rank keeping only its shards (``load_weights``).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import zlib
from typing import Any, Iterable, Iterator

import torch
from tqdm import tqdm

from minisgl.utils import init_logger

from .config import ModelConfig

logger = init_logger(__name__)
# the projections a quantized checkpoint stores quantized: attention, MLP, experts (one by one or
# stacked, gpt-oss), the hybrid models' shared experts and Gated DeltaNet projections but for the
# small b/a ones (Qwen's FP8 checkpoints keep in_proj_b/in_proj_a/in_proj_ba unquantized)
_QUANTIZED = re.compile(
    r"layers\.\d+\.(self_attn|mlp)\.(experts\.\d+\.|shared_expert\.)?"
    r"(q|k|v|o|gate|up|down)_proj\.weight$"
    r"|layers\.\d+\.linear_attn\.(in_proj_qkvz|in_proj_qkv|in_proj_z|out_proj)\.weight$"
    r"|layers\.\d+\.mlp\.experts\.(gate_up|down)_proj$")


def resolve_model_path(model: str | None, revision: str | None = None) -> str:
    """Return a local directory holding ``config.json`` (and weights, tokenizer) for ``model``;
    ``revision`` (a branch, tag or commit) only applies to a Hugging Face repo id."""
    if revision is not None and (model is None or os.path.exists(model)):
        raise ValueError(f"revision: applies to a Hugging Face repo id, not to the local model "
                         f"{model or 'default'!r}")
    if model is None:
        from minisgl.models.default_model import default_model_path

        return default_model_path()
    if os.path.isfile(model) and model.endswith(".gguf"):
        return _gguf_to_dir(model)
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise FileNotFoundError(f"model directory {model!r} has no config.json")
        return model
    if os.path.exists(model) or model.startswith((".", "/", "~")) or model.count("/") != 1:
        raise FileNotFoundError(
            f"model {model!r} is neither a local directory, a .gguf file nor a Hugging Face repo id"
        )
    return _download(model, revision)


def _download(repo_id: str, revision: str | None = None) -> str:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
    except Exception as e:  # offline, unknown repo, gated: one clear line
        raise FileNotFoundError(
            f"model {repo_id!r} is not a local path and could not be fetched from the Hugging Face "
            f"Hub ({type(e).__name__}: {e})"
        ) from None


def _gguf_to_dir(path: str) -> str:
    """Dequantize once into a cached HF directory, keyed by the file's identity."""
    from minisgl.models.default_model import cache_root
    from minisgl.models.gguf_cache import convert_gguf_cached

    stat = os.stat(path)
    key = hashlib.sha1(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    out = os.path.join(cache_root(), f"gguf-{os.path.basename(path)[:-5]}-{key.hexdigest()[:10]}")
    return convert_gguf_cached(path, out)


_SAFETENSORS_DTYPES = {"F8_E4M3": torch.float8_e4m3fn, "BF16": torch.bfloat16,
                       "F16": torch.float16, "F32": torch.float32}


class WeightStream:
    """A checkpoint's ``(name, tensor)`` pairs in the order they are read, with every name known
    before the first tensor is: loading then quantizes and frees each decoder layer as soon as its
    last tensor arrived (``BaseLLMModel.load_weights``)."""

    def __init__(self, names: list[str], tensors: Iterable[tuple[str, Any]]) -> None:
        self.names, self._tensors = names, tensors

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self._tensors)


class CheckpointTensor:
    """A tensor of a safetensors file, read when a parameter loads it (``load()``).

    ``narrow``, slicing along dim 0 and ``to(dtype)`` only record what to read, so a tensor-parallel
    rank reads its shard of each weight from the file and never the whole tensor.
    """

    def __init__(self, part, shape, index: tuple[slice, ...] | None = None,
                 dtype: torch.dtype | None = None) -> None:
        self._part, self.shape, self._dtype = part, torch.Size(shape), dtype
        self._index = index if index is not None else tuple(slice(0, n) for n in shape)

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        dim %= len(self.shape)
        if not (0 <= start and start + length <= self.shape[dim]):
            raise ValueError(f"narrow({dim}, {start}, {length}) is outside shape "
                             f"{tuple(self.shape)}")
        first = self._index[dim].start + start
        index, shape = list(self._index), list(self.shape)
        index[dim], shape[dim] = slice(first, first + length), length
        return CheckpointTensor(self._part, shape, tuple(index), self._dtype)

    def __getitem__(self, rows: slice) -> CheckpointTensor:
        start, stop, step = rows.indices(self.shape[0])
        assert step == 1, "only contiguous row ranges"
        return self.narrow(0, start, max(0, stop - start))

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype the file stores (None where safetensors names one torch lacks)."""
        return _SAFETENSORS_DTYPES.get(self._part.get_dtype())

    def to(self, dtype: torch.dtype) -> CheckpointTensor:
        return CheckpointTensor(self._part, self.shape, self._index, dtype)

    def load(self) -> torch.Tensor:
        tensor = self._part[self._index]
        return tensor.to(self._dtype) if self._dtype is not None else tensor


def iter_weights(model_dir: str) -> WeightStream:
    """Every tensor of the directory's safetensors files, not read yet, with a progress bar."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir!r}")
    handles = [safe_open(file, framework="pt") for file in files]

    def tensors() -> Iterator[tuple[str, CheckpointTensor]]:
        with tqdm(total=len(names), desc="Loading weights", unit="tensor") as bar:
            for handle in handles:
                for name in handle.keys():
                    part = handle.get_slice(name)
                    yield name, CheckpointTensor(part, part.get_shape())
                    bar.update(1)

    names = [name for handle in handles for name in handle.keys()]
    return WeightStream(names, tensors())


def attention_shapes(cfg: ModelConfig, p: str) -> Iterator[tuple[str, tuple[int, ...]]]:
    """A Llama-style decoder layer's norms and attention tensors (their names start with
    ``p``)."""
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_qo_heads * d, cfg.num_kv_heads * d
    yield p + "input_layernorm.weight", (h,)
    yield p + "post_attention_layernorm.weight", (h,)
    for name, rows in (("q", q), ("k", kv), ("v", kv)):
        yield p + f"self_attn.{name}_proj.weight", (rows, h)
        if cfg.attention_bias:
            yield p + f"self_attn.{name}_proj.bias", (rows,)
    yield p + "self_attn.o_proj.weight", (h, q)
    if cfg.qk_norm:
        yield p + "self_attn.q_norm.weight", (d,)
        yield p + "self_attn.k_norm.weight", (d,)


def _checkpoint_shapes(cfg: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Names and full (unsharded) shapes of a Hugging Face checkpoint of ``cfg``."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    yield "model.embed_tokens.weight", (cfg.vocab_size, h)
    if not cfg.tie_word_embeddings:
        yield "lm_head.weight", (cfg.vocab_size, h)
    yield "model.norm.weight", (h,)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        yield from attention_shapes(cfg, p)
        if cfg.is_sparse_layer(i):
            moe = cfg.moe_intermediate_size
            yield p + "mlp.gate.weight", (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                yield p + f"mlp.experts.{e}.gate_proj.weight", (moe, h)
                yield p + f"mlp.experts.{e}.up_proj.weight", (moe, h)
                yield p + f"mlp.experts.{e}.down_proj.weight", (h, moe)
        else:
            yield p + "mlp.gate_proj.weight", (inter, h)
            yield p + "mlp.up_proj.weight", (inter, h)
            yield p + "mlp.down_proj.weight", (h, inter)


def dummy_weights(cfg: ModelConfig, seed: int, device: torch.device,
                  dtype: torch.dtype, values: bool = True) -> WeightStream:
    """Random weights of a realistic scale, for benchmarks without a checkpoint.

    Each full tensor is drawn from a generator seeded by (seed, name) and then sharded by the
    normal loader, so every TP size sees the same model. With a quantized checkpoint's config the
    projection weights come quantized, as that checkpoint would hold them
    (``QuantizationConfig.checkpoint_tensors``); one tensor exists at a time. ``values=False``:
    uninitialised tensors (a shadow run's, ``minisgl.warmup``: only shapes and dtypes matter).
    """
    from .registry import get_model_class

    model_shapes = getattr(get_model_class(cfg.architecture), "checkpoint_shapes", None)
    shapes = list(model_shapes(cfg) if model_shapes is not None else _checkpoint_shapes(cfg))

    def quantized(name: str) -> bool:
        return cfg.quant is not None and bool(_QUANTIZED.search(name))

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name, shape in shapes:
            if name.endswith("norm.weight") or not (values or quantized(name)):
                yield name, (torch.ones if values else torch.empty)(shape, dtype=dtype,
                                                                    device=device)
                continue
            tensor = torch.empty(shape, dtype=dtype, device=device)
            if values:
                gen = torch.Generator(device=device).manual_seed(
                    seed * 1_000_003 + zlib.crc32(name.encode()))
                tensor.normal_(0.0, 0.02, generator=gen)
            # uninitialised ones too: the quantized names, shapes and dtypes the loader expects
            yield from cfg.quant.checkpoint_tensors(name, tensor) if quantized(name) \
                else ((name, tensor),)

    names = [n for name, shape in shapes
             for n in (cfg.quant.checkpoint_names(name, shape) if quantized(name) else (name,))]
    return WeightStream(names, tensors())
