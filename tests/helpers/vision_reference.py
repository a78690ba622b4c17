"""transformers' answer for a chat with images, the reference of the engine's vision tests: the
family's own image processor on the PIL images, the multimodal model's ``generate`` (greedy, no
EOS stop) with the inputs its processor would give beside the ids (Qwen's grids and
``mm_token_type_ids``, Gemma 3's ``token_type_ids``, Gemma 4's patch positions), and the raw
logits of every step."""

from __future__ import annotations

import base64
import io
from functools import lru_cache

import numpy as np
import torch

CLASSES = {"qwen3_5": "Qwen3_5ForConditionalGeneration",
           "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
           "gemma3": "Gemma3ForConditionalGeneration", "gemma4": "Gemma4ForConditionalGeneration"}


def random_image(height: int, width: int, seed: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def data_url(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(images: list, text: str = "what is it?", before: str = "Look:") -> list[dict]:
    parts = [{"type": "text", "text": before}]
    parts += [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


@lru_cache(maxsize=4)
def hf_vision_model(path: str, arch: str):
    import transformers as tf

    model = getattr(tf, CLASSES[arch]).from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # as ignore_eos: every step is generated
    return model


def hf_inputs(path: str, arch: str, ids: torch.Tensor, images: list) -> dict:
    """What transformers' processor gives beside ``ids`` ([1, L]) for ``images``."""
    import transformers as tf

    model = hf_vision_model(path, arch)
    image_token = model.config.image_token_id
    if arch.startswith("qwen"):
        out = tf.Qwen2VLImageProcessorPil.from_pretrained(path)(images=images,
                                                                 return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
                "mm_token_type_ids": (ids == image_token).int()}
    if arch == "gemma3":
        out = tf.Gemma3ImageProcessorPil.from_pretrained(path)(
            images=images, do_pan_and_scan=False, return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "token_type_ids": (ids == image_token).long()}
    out = tf.Gemma4ImageProcessorPil.from_pretrained(path)(images=images, return_tensors="pt")
    return {"pixel_values": out["pixel_values"], "image_position_ids": out["image_position_ids"],
            "mm_token_type_ids": (ids == image_token).int()}


def hf_vision_greedy(path: str, arch: str, prompt: list[int], images: list,
                     new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens after ``prompt`` and each step's logits ``[n, vocab]``."""
    model = hf_vision_model(path, arch)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **hf_inputs(path, arch, ids, images))
    return out.sequences[0, len(prompt):].tolist(), torch.stack(out.logits)[:, 0]
