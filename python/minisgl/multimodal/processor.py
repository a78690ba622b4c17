"""A vision-language checkpoint's image preprocessing and prompt expansion, in the tokenizer
worker.

The pixels come from transformers' PIL image processor of the family (no torchvision), read from
the checkpoint's ``preprocessor_config.json``, one image at a time so that a failure names its
image. The chat template emits one placeholder per image; each becomes the run of image tokens
the tower's output fills, written exactly as transformers' processor writes it (the same text is
then tokenized, so the ids are the ones transformers gives):

- Qwen3.5 / Qwen3.6: ``<|image_pad|>`` -> ``t*h*w / m^2`` of itself (inside the template's
  ``<|vision_start|>...<|vision_end|>``);
- Gemma 3: ``<start_of_image>`` -> ``\\n\\n<start_of_image>`` + ``mm_tokens_per_image``
  ``<image_soft_token>`` + ``<end_of_image>\\n\\n`` (no pan-and-scan crops);
- Gemma 4: ``<|image|>`` -> ``<|image>`` + the image's soft tokens + ``<image|>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from minisgl.utils import init_logger

from .config import MediaOptions
from .decode import decode_image
from .items import ImageItem, MediaError
from .prompt import ImageInput, MultimodalPrompt, image_offsets

logger = init_logger(__name__)


@dataclass(frozen=True)
class ProcessedImage:
    pixel_values: np.ndarray  # float32: the tower's input for this image alone
    grid: tuple[int, ...]  # Qwen (t, h, w) patches; Gemma 4 (h, w) patches; Gemma 3 ()
    num_tokens: int  # the image tokens its placeholder expands to

    @property
    def digest(self) -> str:
        """The content hash prefix caching keys the image's tokens by."""
        h = hashlib.blake2b(np.ascontiguousarray(self.pixel_values).tobytes(), digest_size=16)
        h.update(repr(self.grid).encode())
        return h.hexdigest()


class _Family:
    processor_class: str  # transformers' PIL image processor
    mrope = False

    def __init__(self, raw: dict[str, Any], tokenizer: Any, model_dir: str) -> None:
        import transformers

        self.raw, self.tokenizer = raw, tokenizer
        self.processor = getattr(transformers, self.processor_class).from_pretrained(model_dir)
        self.image_token_id = self.token_id("image_token_id", "image_token_index")
        self.image_token = self.token(self.image_token_id)

    def token_id(self, *keys: str) -> int:
        for key in keys:
            if isinstance(self.raw.get(key), int):
                return self.raw[key]
        raise ValueError(f"config.json: {keys[0]} is missing")

    def token(self, token_id: int) -> str:
        text = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(text, str):
            raise ValueError(f"the tokenizer has no token {token_id} (the config's image token)")
        return text

    placeholder = property(lambda self: self.image_token)

    def preprocess(self, image) -> ProcessedImage:
        raise NotImplementedError

    def replacement(self, image: ProcessedImage) -> str:
        return self.image_token * image.num_tokens


class QwenImages(_Family):
    processor_class = "Qwen2VLImageProcessorPil"
    mrope = True

    def preprocess(self, image) -> ProcessedImage:
        out = self.processor(images=[image], return_tensors="np")
        grid = tuple(int(v) for v in out["image_grid_thw"][0])
        merge = self.processor.merge_size
        return ProcessedImage(out["pixel_values"], grid, int(np.prod(grid)) // merge ** 2)


class Gemma3Images(_Family):
    processor_class = "Gemma3ImageProcessorPil"

    def __init__(self, raw: dict[str, Any], tokenizer: Any, model_dir: str) -> None:
        super().__init__(raw, tokenizer, model_dir)
        self.boi = self.token(self.token_id("boi_token_index", "boi_token_id"))
        self.eoi = self.token(self.token_id("eoi_token_index", "eoi_token_id"))
        self.tokens_per_image = int(raw.get("mm_tokens_per_image", 256))

    placeholder = property(lambda self: self.boi)

    def preprocess(self, image) -> ProcessedImage:
        out = self.processor(images=[image], do_pan_and_scan=False, return_tensors="np")
        return ProcessedImage(out["pixel_values"][0], (), self.tokens_per_image)

    def replacement(self, image: ProcessedImage) -> str:
        return f"\n\n{self.boi}{self.image_token * image.num_tokens}{self.eoi}\n\n"


class Gemma4Images(_Family):
    processor_class = "Gemma4ImageProcessorPil"

    def __init__(self, raw: dict[str, Any], tokenizer: Any, model_dir: str) -> None:
        super().__init__(raw, tokenizer, model_dir)
        self.boi = self.token(self.token_id("boi_token_id", "boi_token_index"))
        self.eoi = self.token(self.token_id("eoi_token_id", "eoi_token_index"))

    def preprocess(self, image) -> ProcessedImage:
        out = self.processor(images=[image], return_tensors="np")
        positions = out["image_position_ids"][0]
        real = (positions >= 0).all(-1)  # the processor pads every image to one patch budget
        grid = (int(positions[real, 1].max()) + 1, int(positions[real, 0].max()) + 1)
        tokens = int(out["num_soft_tokens_per_image"][0])
        return ProcessedImage(out["pixel_values"][0][real], grid, tokens)

    def replacement(self, image: ProcessedImage) -> str:
        return f"{self.boi}{self.image_token * image.num_tokens}{self.eoi}"


FAMILIES: dict[str, type[_Family]] = {
    "Qwen3_5ForConditionalGeneration": QwenImages,
    "Qwen3_5MoeForConditionalGeneration": QwenImages,
    "Gemma3ForConditionalGeneration": Gemma3Images,
    "Gemma4ForConditionalGeneration": Gemma4Images,
}


class ImageProcessor:
    """Decodes, preprocesses and places one request's images for a checkpoint. Its family (the
    transformers image processor: seconds of imports on a slow host) may still be loading
    (``for_model(..., background=True)``): the first image request waits for it, and a load
    that failed fails every image request with its reason."""

    def __init__(self, family: _Family | Future[_Family], opts: MediaOptions) -> None:
        self._family, self.opts = family, opts

    @property
    def family(self) -> _Family:
        if isinstance(self._family, Future):
            try:
                family = self._family.result()
            except Exception as e:  # the server's fault, not the request's (a 500)
                raise RuntimeError(f"the image processor failed to load: {e}") from None
            self._family = family
        return self._family

    @classmethod
    def for_model(cls, model_dir: str, tokenizer: Any, opts: MediaOptions | None = None,
                  background: bool = False) -> ImageProcessor | None:
        """None for a checkpoint without a vision tower (or without a tokenizer). ``background``:
        the family loads on a thread of its own (a server's tokenizer worker reports ready
        without waiting for it)."""
        from minisgl.models.vision import has_vision

        path = os.path.join(model_dir, "config.json")
        if tokenizer is None or not os.path.isfile(path):
            return None
        with open(path) as f:
            raw = json.load(f)
        if not has_vision(raw) or raw["architectures"][0] not in FAMILIES:
            return None
        family_cls, opts = FAMILIES[raw["architectures"][0]], opts or MediaOptions()
        if not background:
            return cls(family_cls(raw, tokenizer, model_dir), opts)
        future: Future[_Family] = Future()

        def load() -> None:
            start = time.perf_counter()
            try:
                future.set_result(family_cls(raw, tokenizer, model_dir))
                logger.info("image processor loaded in %.1f s", time.perf_counter() - start)
            except Exception as e:  # reported by every image request
                logger.exception("loading the image processor failed")
                future.set_exception(e)

        threading.Thread(target=load, name="image-processor", daemon=True).start()
        return cls(future, opts)

    def preprocess(self, item: ImageItem) -> ProcessedImage:
        image = decode_image(item.data, item.field, self.opts.max_image_pixels)
        try:
            return self.family.preprocess(image)
        except ValueError as e:  # e.g. an aspect ratio beyond the processor's limit
            raise MediaError(item.field, f"the image cannot be preprocessed: {e}") from None

    def check_placeholders(self, text: str, count: int, param: str = "messages") -> None:
        found = text.count(self.family.placeholder)
        if found != count:
            raise MediaError(param, f"the prompt holds {found} image placeholders "
                             f"({self.family.placeholder!r}) for {count} images; a text may not "
                             "contain the placeholder")

    def expand(self, text: str, images: list[ProcessedImage], param: str = "messages") -> str:
        """``text`` (the rendered template) with each placeholder replaced by its image's run."""
        self.check_placeholders(text, len(images), param)
        pieces = text.split(self.family.placeholder)
        out = [pieces[0]]
        for image, piece in zip(images, pieces[1:]):
            out += [self.family.replacement(image), piece]
        return "".join(out)

    def prompt(self, text: str, items: list[ImageItem], encode: Callable[[str], list[int]],
               param: str = "messages") -> MultimodalPrompt:
        """The tokenized prompt of a rendered template and its images, as the engine takes it."""
        self.check_placeholders(text, len(items), param)  # before the costly preprocessing
        images = [self.preprocess(item) for item in items]
        ids = encode(self.expand(text, images, param))
        offsets = image_offsets(ids, self.family.image_token_id, [i.num_tokens for i in images])
        delta = None
        if self.family.mrope:
            from .mrope import mrope_positions

            merge = self.family.processor.merge_size
            _, delta = mrope_positions(ids, self.family.image_token_id, [i.grid for i in images],
                                       merge)
        inputs = [ImageInput(pixel_values=np.ascontiguousarray(i.pixel_values,
                                                               np.float32).tobytes(),
                             shape=tuple(i.pixel_values.shape), grid=i.grid, offset=offset,
                             num_tokens=i.num_tokens, digest=i.digest, field=item.field)
                  for i, item, offset in zip(images, items, offsets)]
        return MultimodalPrompt(input_ids=ids, images=inputs,
                                image_token_id=self.family.image_token_id, mrope_delta=delta)
