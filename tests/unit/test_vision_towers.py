"""The vision towers (``minisgl.models.vision``) against transformers' own, float32 on CPU: the
embeddings the language model receives for each image agree within 1e-4, for images of several
shapes in one call, loaded from tiny checkpoints under the released checkpoints' names."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.vision_models import make_vision_checkpoint
from minisgl.models.vision import create_vision_tower, has_vision, load_vision_tower

ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    return {arch: make_vision_checkpoint(arch, root / arch)
            for arch in ("qwen3_5", "qwen3_5_moe", "gemma3", "gemma4")}


def _hf(path, arch: str):
    import transformers as tf

    cls = {"qwen3_5": tf.Qwen3_5ForConditionalGeneration,
           "qwen3_5_moe": tf.Qwen3_5MoeForConditionalGeneration,
           "gemma3": tf.Gemma3ForConditionalGeneration,
           "gemma4": tf.Gemma4ForConditionalGeneration}[arch]
    return cls.from_pretrained(path, dtype=torch.float32).eval()


def _ours(path):
    raw = json.loads((path / "config.json").read_text())
    return load_vision_tower(str(path), raw, torch.float32)


def _images(sizes: list[tuple[int, int]], seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def _close(ours: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_vit(checkpoints, arch):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    path = checkpoints[arch]
    proc = Qwen2VLImageProcessorPil.from_pretrained(path)
    # grids of 8x8, 16x8 (non-square) and 12x20 patches: the 6x6 position table is resampled
    inputs = proc(_images([(32, 32), (64, 30), (47, 80)]), return_tensors="pt")
    grid = inputs["image_grid_thw"]
    hf = _hf(path, arch)
    with torch.no_grad():
        ref = hf.model.get_image_features(inputs["pixel_values"], grid).pooler_output
        tower = _ours(path)
        sizes = (grid.prod(-1)).tolist()
        ours = tower(list(inputs["pixel_values"].split(sizes)), grid.tolist())
    assert [t.shape[0] for t in ours] == [16, 32, 60]
    _close(ours, list(ref))


def test_gemma3_siglip(checkpoints):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    path = checkpoints["gemma3"]
    proc = Gemma3ImageProcessorPil.from_pretrained(path)
    pixels = proc(_images([(32, 32), (50, 21)]), return_tensors="pt")["pixel_values"]
    hf = _hf(path, "gemma3")
    with torch.no_grad():
        ref = hf.model.get_image_features(pixels).pooler_output
        ours = _ours(path)(list(pixels.split(1)), [(), ()])
    _close(ours, list(ref))


def test_gemma4_vit(checkpoints):
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    path = checkpoints["gemma4"]
    proc = Gemma4ImageProcessorPil.from_pretrained(path)
    out = proc(_images([(40, 40), (24, 70)]), return_tensors="pt")
    hf = _hf(path, "gemma4")
    with torch.no_grad():
        ref = hf.model.get_image_features(out["pixel_values"],
                                          out["image_position_ids"]).pooler_output
        pixels, grids = [], []
        for patches, pos in zip(out["pixel_values"], out["image_position_ids"]):
            real = (pos >= 0).all(-1)
            pixels.append(patches[real])
            grids.append((int(pos[real, 1].max()) + 1, int(pos[real, 0].max()) + 1))
        ours = _ours(path)(pixels, grids)
    _close(ours, list(ref))


def test_text_models_have_no_tower(checkpoints):
    raw = json.loads((checkpoints["qwen3_5"] / "config.json").read_text())
    assert has_vision(raw)
    text_only = {**raw, "architectures": ["Qwen3NextForCausalLM"]}
    assert not has_vision(text_only)
    with pytest.raises(ValueError, match="has no vision tower"):
        create_vision_tower(text_only)


def test_missing_tensor_is_named(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    src = checkpoints["qwen3_5"]
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.visual.merger.norm.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    raw = json.loads((src / "config.json").read_text())
    with pytest.raises(ValueError, match="merger.norm.weight"):
        load_vision_tower(str(tmp_path), raw, torch.float32)
