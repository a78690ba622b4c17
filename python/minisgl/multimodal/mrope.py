"""Qwen3.5 / Qwen3.6's multimodal rotary positions (M-RoPE), as pure functions of the prompt.

Every token has three positions, (temporal, height, width). A text token has the same value in all
three, one more than the largest position before it. The tokens of an image with a merged grid of
``t' x h' x w'`` (``(t, h, w)`` patches, ``m x m`` of them folded into each token) sit on that
grid: ``(start + i, start + j, start + k)``, in raster order; the text after it starts at
``start + max(h', w')``. Positions therefore run behind the token index by a constant after the
last image, the ``delta`` a decode step adds to its index (``index + delta`` in all three).

The rotary angle of each frequency then comes from one of the three positions: the config's
``mrope_section = [s_t, s_h, s_w]`` counts the frequencies of each; with ``mrope_interleaved``
(every Qwen3.5/3.6 release) frequency ``i`` takes height when ``i % 3 == 1`` and ``i < 3 * s_h``,
width when ``i % 3 == 2`` and ``i < 3 * s_w``, else temporal; without it, the first ``s_t``
frequencies take temporal, the next ``s_h`` height, the rest width.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def mrope_positions(input_ids: Sequence[int], image_token_id: int,
                    grids: Sequence[tuple[int, int, int]], merge_size: int
                    ) -> tuple[np.ndarray, int]:
    """The ``[3, len(input_ids)]`` positions of a prompt whose images (``grids``, in patches,
    in the order they appear) fill runs of ``image_token_id``, and the decode ``delta``."""
    ids = np.asarray(input_ids, dtype=np.int64)
    out = np.empty((3, len(ids)), dtype=np.int64)
    starts = np.flatnonzero(ids == image_token_id)
    i = nxt = 0  # token index, next position
    for t, h, w in grids:
        t, h, w = int(t), int(h) // merge_size, int(w) // merge_size
        after = starts[starts >= i]
        begin = int(after[0]) if len(after) else -1
        n = t * h * w
        if begin < 0 or begin + n > len(ids) or not (ids[begin:begin + n] == image_token_id).all():
            raise ValueError(f"prompt: an image of {n} tokens has no run of {n} image tokens")
        out[:, i:begin] = np.arange(nxt, nxt + begin - i)
        nxt += begin - i
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        out[:, begin:begin + n] = nxt + np.stack([tt, hh, ww]).reshape(3, n)
        nxt += max(h, w)
        i = begin + n
    if np.any(ids[i:] == image_token_id):
        raise ValueError("prompt: more image tokens than the images fill")
    out[:, i:] = np.arange(nxt, nxt + len(ids) - i)
    nxt += len(ids) - i
    return out, nxt - len(ids)


def decode_positions(index: int, delta: int) -> np.ndarray:
    """The three (equal) positions of the token at ``index`` after the prompt."""
    return np.full(3, index + delta, dtype=np.int64)


def mrope_axis(num_freqs: int, section: Sequence[int], interleaved: bool) -> torch.Tensor:
    """For each rotary frequency, which position it turns with: 0 temporal, 1 height, 2 width."""
    axis = torch.zeros(num_freqs, dtype=torch.long)
    if interleaved:
        for dim in (1, 2):
            axis[dim:section[dim] * 3:3] = dim
        return axis
    if sum(section) != num_freqs:
        raise ValueError(f"mrope_section {list(section)} must add up to {num_freqs}")
    return torch.repeat_interleave(torch.arange(3), torch.tensor(list(section)))


def mrope_angles(positions: torch.Tensor, inv_freq: torch.Tensor, section: Sequence[int],
                 interleaved: bool) -> torch.Tensor:
    """``[3, n]`` positions -> ``[n, num_freqs]`` rotary angles (float32): each frequency times
    the position of its axis. Text tokens (three equal positions) get plain RoPE's angles."""
    axis = mrope_axis(inv_freq.numel(), section, interleaved).to(positions.device)
    chosen = positions.gather(0, axis[:, None].expand(-1, positions.shape[1]))  # [freqs, n]
    return chosen.t().float() * inv_freq.float().to(positions.device)
