"""What the tokenizer worker makes of a prompt with images: the typed hand-off to the engine.

``MultimodalPrompt`` holds the token ids (each image's placeholder already expanded to its run of
image tokens) and, per image, the tower's input, where its run starts and its content hash::

    input_ids  ... <|vision_start|> I I I I I I <|vision_end|> ... <|vision_start|> I I I ...
                                    ^ images[0].offset, num_tokens = 6      ^ images[1].offset

The engine puts the tower's ``num_tokens`` output rows in place of the embeddings of the tokens
``offset .. offset + num_tokens``; a prefix cache keys those tokens by ``digest`` (two different
images must never share a cached prefix, the same image should). ``mrope_delta`` (Qwen only): a
token after the prompt at index ``i`` has the three rotary positions ``i + mrope_delta``
(``mrope.py`` gives the prompt's own).
"""

from __future__ import annotations

from typing import Sequence

import msgspec


class ImageInput(msgspec.Struct, frozen=True):
    pixel_values: bytes  # float32, C order, of ``shape``
    shape: tuple[int, ...]
    grid: tuple[int, ...]  # as the family's tower takes it (models/vision/)
    offset: int
    num_tokens: int
    digest: str
    field: str = "messages"  # the request field it came from, which an error about it names

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens

    @property
    def key(self) -> int:
        """The id a prefix cache keys this image's tokens by: negative (never a token id),
        from the content hash."""
        return -1 - int(self.digest[:15], 16)

    def pixels(self):
        """The tower's input as a float32 CPU tensor of ``shape``."""
        import numpy as np
        import torch

        array = np.frombuffer(self.pixel_values, dtype=np.float32).reshape(self.shape)
        return torch.from_numpy(array.copy())


class MultimodalPrompt(msgspec.Struct, frozen=True):
    input_ids: list[int]
    images: list[ImageInput]
    image_token_id: int
    mrope_delta: int | None = None

    def cache_key(self) -> list[int]:
        """``input_ids`` with each image's tokens replaced by its ``key``."""
        key = list(self.input_ids)
        for image in self.images:
            key[image.offset:image.end] = [image.key] * image.num_tokens
        return key

    def check(self, input_ids: Sequence[int]) -> None:
        """Raise ``ValueError`` unless the images fill runs of image tokens of ``input_ids``."""
        if list(input_ids) != self.input_ids:
            raise ValueError("prompt: the token ids differ from the multimodal prompt's")
        for image in self.images:
            if image.end > len(input_ids) or any(
                    t != self.image_token_id for t in input_ids[image.offset:image.end]):
                raise ValueError(f"prompt: an image of {image.num_tokens} tokens at "
                                 f"{image.offset} is not a run of image tokens")


def image_offsets(ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> list[int]:
    """Where each image's run of ``image_token_id`` starts: image ``k`` takes the first
    ``counts[k]`` image tokens after image ``k - 1``'s; they must be consecutive, and no image
    token may be left over."""
    offsets, i = [], 0
    for n in counts:
        while i < len(ids) and ids[i] != image_token_id:
            i += 1
        if i + n > len(ids) or any(t != image_token_id for t in ids[i:i + n]):
            raise ValueError(f"messages: an image of {n} tokens has no run of {n} image tokens")
        offsets.append(i)
        i += n
    if image_token_id in ids[i:]:
        raise ValueError("messages: the prompt holds more image tokens than its images fill")
    return offsets
