"""The images of a forward: the vision tower run once per image, its output kept while the
request's prefill chunks consume it, and what the model reads (``core.BatchImages``).

An image's tokens occupy ``[offset, end)`` of its prompt (``multimodal/prompt.py``). A prefill
chunk computes positions ``[cached_len, device_len)``; each image it overlaps gives the rows of
the tower's output for the overlap::

    prompt   ... text ... | I I I I I I I I | ... text ...
                          offset           end
    chunk k        [cached_len ...... device_len)          (may cut through an image: Qwen)
    rows taken            |  0 .. 4 |  of the image's [num_tokens, hidden] output

The output is kept by the image's content hash (``digest``) as long as a request that holds the
image has not fed its last token, so a prompt cut into chunks, or two requests with the same image
in one step, encode it once; it is freed when consumed (or when the request leaves). All the
images a step lacks go through the tower in one call.

For Qwen (M-RoPE) every token of a batch with such a request gets its three positions: the
prompt's from ``multimodal/mrope.py``, and ``index + delta`` after it; a decode batch that
replays a CUDA graph gets only the deltas (``decode_shifts``), since its tokens' three positions
are equal. For Gemma, an image's
tokens attend to each other both ways: ``key_limits`` gives each token the last key position it
sees (its image's last token, or itself), and the scheduler keeps an image inside one chunk.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from minisgl.attention import BaseAttnBackend
from minisgl.core import Batch, BatchImages, Feed, Req
from minisgl.models.vision import VisionTower
from minisgl.multimodal.items import MediaError
from minisgl.multimodal.prompt import ImageInput, MultimodalPrompt
from minisgl.utils import init_logger

logger = init_logger(__name__)


@dataclass
class _Kept:
    embeds: torch.Tensor  # [num_tokens, hidden]
    holders: set[int] = field(default_factory=set)  # uids that still have tokens of it to feed


class ImageEncoder:
    """``tower``: the checkpoint's vision tower (``models/vision/``), loaded, on the device.
    ``image_token_id``: the placeholder token; ``mrope``: Qwen's rotary sections (None: 1-D
    positions) and ``merge``: its tower's spatial merge size; ``image_blocks``: some layer
    attends both ways inside an image (Gemma); ``max_tokens``: the most image tokens of one
    tower call, and so of one image (``--max-image-tokens``; the memory profile reserves such a
    call, ``memory.py``)."""

    def __init__(self, tower: VisionTower, image_token_id: int, device: torch.device,
                 mrope: bool = False, merge: int = 1, image_blocks: bool = False,
                 max_tokens: int = 16384) -> None:
        self.tower, self.image_token_id, self.device = tower, image_token_id, device
        self.mrope, self.merge, self.image_blocks = mrope, merge, image_blocks
        self.max_tokens = max_tokens
        self.kept: dict[str, _Kept] = {}
        self._positions: dict[int, tuple[np.ndarray, int]] = {}  # uid -> M-RoPE of its prompt
        self.num_encoded = 0  # images run through the tower (tests, stats)

    @classmethod
    def load(cls, model_path: str, rotary_mrope: bool, image_blocks: bool, dtype: torch.dtype,
             device: torch.device, dummy: bool = False,
             max_tokens: int | None = None) -> ImageEncoder | None:
        """The encoder of the checkpoint at ``model_path``, or None if it has no vision tower;
        ``max_tokens`` None: the largest image the family's processor makes."""
        from minisgl.models.vision import create_vision_tower, has_vision, load_vision_tower

        path = os.path.join(model_path, "config.json")
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            raw = json.load(f)
        if not has_vision(raw):
            return None
        token = next((raw[k] for k in ("image_token_id", "image_token_index")
                      if isinstance(raw.get(k), int)), None)
        if token is None:
            raise ValueError("config.json: image_token_id is missing (a vision tower needs it)")
        with torch.device(device):  # built and initialised there, as the text model is (a
            # float32 tower of 0.4B parameters initialised on the CPU took seconds, more while
            # the kernel warm-up's threads held the cores)
            tower = (create_vision_tower(raw).to(dtype=dtype).eval() if dummy
                     else load_vision_tower(model_path, raw, dtype, device))
        merge = int(raw["vision_config"].get("spatial_merge_size", 1))
        logger.info("vision tower: %s, %.2f GiB", type(tower).__name__,
                    sum(p.numel() * p.element_size() for p in tower.parameters()) / (1 << 30))
        return cls(tower, token, device, rotary_mrope, merge, image_blocks,
                   max_tokens or tower.default_max_tokens)

    # ---- requests ---------------------------------------------------------------------------

    def check(self, input_ids: list[int], mm: MultimodalPrompt | None,
              backend: BaseAttnBackend) -> None:
        """Raise ``ValueError`` unless ``mm``'s images sit on runs of this model's image token
        (and a prompt without images holds none) and ``backend`` attends as the model needs."""
        if mm is None:
            if self.image_token_id in input_ids:
                raise ValueError(f"prompt: holds the image token ({self.image_token_id}) but no "
                                 "image (send the image with it)")
            return
        if self.image_blocks and not backend.supports_image_blocks:
            raise ValueError(
                f"messages: the attention backend {type(backend).__name__} cannot let an "
                "image's tokens attend to each other both ways, as this model needs; serve "
                "images with --attn torch, triton or fa")
        for image in mm.images:
            if image.num_tokens > self.max_tokens:
                raise MediaError(image.field, f"the image takes {image.num_tokens} tokens, more "
                                 f"than the {self.max_tokens} an image may take "
                                 "(--max-image-tokens); send a smaller image")
        if mm.image_token_id != self.image_token_id:
            raise ValueError(f"prompt: images on token {mm.image_token_id}, but this model's "
                             f"image token is {self.image_token_id}")
        mm.check(input_ids)

    def decode_shifts(self, batch: Batch) -> list[int] | None:
        """A decode batch's rotary shifts, one per request (its M-RoPE ``delta``, 0 for text),
        which the decode graph adds to each index (``graph.py``); None: no request has one."""
        if not self.mrope or all(feed.req.mm is None for feed in batch.feeds):
            return None
        return [self._prompt_positions(feed.req)[1] if feed.req.mm is not None else 0
                for feed in batch.feeds]

    def forget(self, req: Req) -> None:
        """``req`` left (finished, aborted or retracted): it holds none of its images now."""
        self._positions.pop(req.uid, None)
        if req.mm is not None:
            for image in req.mm.images:
                self._drop(image.digest, req.uid)

    # ---- one batch --------------------------------------------------------------------------

    def attach(self, batch: Batch) -> None:
        """Set ``batch.images`` when a request of the batch has images (None otherwise): run the
        tower on the images its chunks reach that are not kept, take their rows."""
        if not any(feed.req.mm is not None for feed in batch.feeds):
            return
        n_dec = batch.num_decode_rows
        rows: list[int] = []
        pieces: list[tuple[ImageInput, int, int]] = []
        row = 0
        for i, feed in enumerate(batch.feeds):
            if i >= n_dec and feed.req.mm is not None:
                for image in feed.req.mm.images:
                    lo, hi = max(image.offset, feed.cached_len), min(image.end, feed.device_len)
                    if lo < hi:
                        rows += range(row + lo - feed.cached_len, row + hi - feed.cached_len)
                        pieces.append((image, lo - image.offset, hi - image.offset))
            row += feed.extend_len
        if not pieces and not self.mrope:  # nothing differs from a text batch
            return
        self._encode([image for image, _, _ in pieces])
        embeds = [self.kept[image.digest].embeds[a:b] for image, a, b in pieces]
        hidden = self._hidden_size(embeds)
        images = BatchImages(
            rows=torch.tensor(rows, dtype=torch.int64).to(self.device, non_blocking=True),
            embeds=(torch.cat(embeds) if embeds else
                    torch.empty(0, hidden, device=self.device)))
        total = batch.positions.shape[0] if batch.positions is not None else row
        if self.mrope:
            images.positions = self._mrope_positions(batch.feeds, total)
        if self.image_blocks and pieces:
            images.key_limits = self._key_limits(batch.feeds, n_dec, total)
        batch.images = images
        for i, feed in enumerate(batch.feeds):  # what the chunks consumed is freed
            if i >= n_dec and feed.req.mm is not None:
                for image in feed.req.mm.images:
                    self._hold(image.digest, feed)

    def _encode(self, images: list[ImageInput]) -> None:
        """Run the tower once over every image of ``images`` that is not kept."""
        todo = list({image.digest: image for image in images
                     if image.digest not in self.kept}.values())
        if not todo:
            return
        for call in self._calls(todo):
            pixels = [image.pixels().to(self.device, non_blocking=True) for image in call]
            with torch.inference_mode():
                out = self.tower(pixels, [tuple(image.grid) for image in call])
            self._keep(call, out)
        self.num_encoded += len(todo)

    def _calls(self, images: list[ImageInput]) -> list[list[ImageInput]]:
        """``images`` in tower calls of at most ``max_tokens`` tokens each (every image fits
        one: ``check``), in order: no call's activations exceed what the profile reserved."""
        calls: list[list[ImageInput]] = [[]]
        used = 0
        for image in images:
            if calls[-1] and used + image.num_tokens > self.max_tokens:
                calls.append([])
                used = 0
            calls[-1].append(image)
            used += image.num_tokens
        return calls

    def _keep(self, images: list[ImageInput], out: list[torch.Tensor]) -> None:
        for image, embeds in zip(images, out):
            if embeds.shape[0] != image.num_tokens:
                raise RuntimeError(f"the vision tower gave {embeds.shape[0]} rows for an image "
                                   f"of {image.num_tokens} tokens")
            self.kept[image.digest] = _Kept(embeds)

    def _hidden_size(self, embeds: list[torch.Tensor]) -> int:
        if embeds:
            return embeds[0].shape[-1]
        return next(iter(self.kept.values())).embeds.shape[-1] if self.kept else 0

    def _hold(self, digest: str, feed: Feed) -> None:
        """``feed.req`` holds ``digest`` while one of its images of that content ends past what
        the forward computes."""
        assert feed.req.mm is not None
        if any(i.digest == digest and i.end > feed.device_len for i in feed.req.mm.images):
            if digest in self.kept:
                self.kept[digest].holders.add(feed.uid)
        else:
            self._drop(digest, feed.uid)

    def _drop(self, digest: str, uid: int) -> None:
        kept = self.kept.get(digest)
        if kept is None:
            return
        kept.holders.discard(uid)
        if not kept.holders:
            del self.kept[digest]

    def _mrope_positions(self, feeds: list[Feed], total: int) -> torch.Tensor:
        """``[3, total]``: each token's M-RoPE positions (padding tokens 0)."""
        out = np.zeros((3, total), dtype=np.int64)
        row = 0
        for feed in feeds:
            p = np.arange(feed.cached_len, feed.device_len)
            if feed.req.mm is None:
                out[:, row:row + len(p)] = p
            else:
                prompt, delta = self._prompt_positions(feed.req)
                inside = p < prompt.shape[1]
                out[:, row:row + len(p)] = np.where(inside, prompt[:, np.minimum(
                    p, prompt.shape[1] - 1)], p + delta)
            row += len(p)
        return torch.from_numpy(out).to(self.device, non_blocking=True)

    def _prompt_positions(self, req: Req) -> tuple[np.ndarray, int]:
        if req.uid not in self._positions:
            from minisgl.multimodal.mrope import mrope_positions

            assert req.mm is not None
            grids = [(image.grid[0], image.grid[1], image.grid[2]) for image in req.mm.images]
            self._positions[req.uid] = mrope_positions(req.input_ids[:req.prompt_len],
                                                       self.image_token_id, grids, self.merge)
        return self._positions[req.uid]

    def _key_limits(self, feeds: list[Feed], n_dec: int, total: int) -> torch.Tensor:
        """``[total]`` int32: the last key each token sees; an image's tokens see its last."""
        out = np.zeros(total, dtype=np.int32)
        row = 0
        for i, feed in enumerate(feeds):
            p = np.arange(feed.cached_len, feed.device_len, dtype=np.int32)
            if i >= n_dec and feed.req.mm is not None:
                for image in feed.req.mm.images:
                    inside = (p >= image.offset) & (p < image.end)
                    p = np.where(inside, image.end - 1, p)
            out[row:row + len(p)] = p
            row += len(p)
        return torch.from_numpy(out).to(self.device, non_blocking=True)
