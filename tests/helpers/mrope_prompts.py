"""Prompts of text and images for the M-RoPE tests: token ids and the images' grids."""

from __future__ import annotations

IMAGE, MERGE = 99, 2  # the image token and the tower's spatial merge


def mrope_prompt(pieces: list) -> tuple[list[int], list[tuple[int, int, int]]]:
    """Text lengths and image grids ``(t, h, w)`` in order -> token ids (text 5, each image's
    ``t * h * w / MERGE**2`` tokens ``IMAGE``) and the grids."""
    ids, grids = [], []
    for p in pieces:
        if isinstance(p, int):
            ids += [5] * p
        else:
            grids.append(p)
            ids += [IMAGE] * (p[0] * p[1] * p[2] // MERGE ** 2)
    return ids, grids
