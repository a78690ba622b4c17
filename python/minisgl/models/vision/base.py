"""What every vision tower shares: the contract the engine relies on and the weight-loading loop.

A tower turns one request's preprocessed images (``minisgl.multimodal``: one ``pixel_values``
array and one ``grid`` per image) into the embeddings the language model receives in place of
that image's placeholder tokens, one ``[num_tokens, text_hidden]`` tensor per image, in the
model's dtype. It holds no state between calls, so the encoder may run once per image and its
output be cached by the image's content hash.

Towers are replicated on every tensor-parallel rank: each rank sees the same batch and encodes
the same images, so no collective is needed. The largest (Qwen3.5's 27 blocks of width 1152,
Gemma 3's SigLIP of the same shape) hold about 0.4B parameters, 0.8 GB in bf16 per rank.

The engine encodes at most ``--max-image-tokens`` image tokens in one call (each image at most
that many) and reserves the activations of such a call when it sizes the KV pool: ``dummy_input``
is that call's input, and ``default_max_tokens`` the largest image the family's processor makes.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch
from torch import nn


class VisionTower(nn.Module):
    """``forward(pixels, grids) -> list[Tensor]``: one embedding tensor per image.

    Subclasses set ``prefixes`` (checkpoint name prefix -> ours, for the tower and its
    projector in every layout the releases and transformers use; the longest match wins) and may
    override ``local_name`` (our name -> our parameter's name, None to skip the tensor) and
    ``convert`` (reshape a checkpoint tensor into our parameter's layout)."""

    prefixes: dict[str, str] = {}
    default_max_tokens = 16384

    @classmethod
    def from_config(cls, raw: dict[str, Any]) -> VisionTower:
        """The tower of a checkpoint's whole ``config.json`` dict."""
        raise NotImplementedError

    def forward(self, pixels: list[torch.Tensor], grids: list[tuple[int, ...]]
                ) -> list[torch.Tensor]:
        raise NotImplementedError

    def dummy_input(self, num_tokens: int) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
        """The input (zeros, float32, on the tower's device) of the largest call with at most
        ``num_tokens`` image tokens, which the memory profile runs."""
        raise NotImplementedError

    def _zeros(self, *shape: int) -> torch.Tensor:
        """Pixels as the engine hands them over: float32, on the tower's device."""
        return torch.zeros(shape, device=next(self.parameters()).device)

    def local_name(self, name: str) -> str | None:
        return name

    def convert(self, name: str, tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        return tensor

    def owns(self, name: str) -> bool:
        return name.startswith(tuple(self.prefixes))

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """Copy the tower's tensors out of a checkpoint's ``(name, tensor)`` stream (tensors of
        other parts are skipped unread); every parameter and buffer must be found once."""
        params = dict(self.named_parameters())
        params.update(self.named_buffers(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if not self.owns(name):
                continue
            prefix = max((p for p in self.prefixes if name.startswith(p)), key=len)
            local = self.local_name(self.prefixes[prefix] + name[len(prefix):])
            if local is None:
                continue
            if local not in params:
                raise ValueError(f"vision tower: unexpected checkpoint tensor {name!r}")
            if local in loaded:
                raise ValueError(f"vision tower: {name!r} appears twice in the checkpoint")
            value = tensor.load() if hasattr(tensor, "load") else tensor
            param = params[local]
            value = self.convert(local, value, param)
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"vision tower: {name!r} has shape {tuple(value.shape)}, "
                                 f"expected {tuple(param.shape)}")
            param.copy_(value.to(param.dtype))
            loaded.add(local)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"vision tower: the checkpoint lacks {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def near_square(num_tokens: int) -> tuple[int, int]:
    """``(a, b)``, ``a <= b``, the most tokens ``a * b <= num_tokens`` of a near-square grid."""
    a = max(1, math.isqrt(num_tokens))
    return a, max(1, num_tokens // a)
