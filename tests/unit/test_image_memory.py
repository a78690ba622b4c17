"""The vision tower in the memory profile (``engine/memory.py``'s ``image_bytes``) and the limit
it rests on (``--max-image-tokens``, ``engine/images.py``): the bytes reserved for the tower's
largest call grow with the limit and come off the KV pool; an image above the limit is refused
naming its field; a step's images go through the tower in calls within the limit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers.hybrid_models import _TEXT as QWEN_TEXT
from helpers.vision_models import GEMMA3_VISION, QWEN_VISION
from minisgl.engine import memory
from minisgl.engine.images import ImageEncoder
from minisgl.models.vision import create_vision_tower
from minisgl.multimodal.items import MediaError
from minisgl.multimodal.prompt import ImageInput, MultimodalPrompt

IMAGE = 99
CPU = torch.device("cpu")


def _encoder(max_tokens: int, arch: str = "Qwen3_5ForConditionalGeneration") -> ImageEncoder:
    vision = QWEN_VISION if arch.startswith("Qwen") else {**GEMMA3_VISION}
    raw = {"architectures": [arch], "vision_config": vision, "text_config": QWEN_TEXT,
           "mm_tokens_per_image": 16}
    tower = create_vision_tower(raw).eval()
    return ImageEncoder(tower, IMAGE, CPU, mrope=True, merge=2, max_tokens=max_tokens)


def _engine(max_tokens: int, arch: str = "Qwen3_5ForConditionalGeneration") -> SimpleNamespace:
    return SimpleNamespace(images=_encoder(max_tokens, arch), device=CPU)


@pytest.mark.parametrize("arch", ["Qwen3_5ForConditionalGeneration",
                                  "Gemma3ForConditionalGeneration"])
def test_reserved_bytes_grow_with_the_limit(arch):
    sizes = [memory.image_bytes(_engine(n, arch)) for n in (8, 32, 128)]
    assert 0 < sizes[0] < sizes[1] < sizes[2]
    assert sizes[2] > 3 * sizes[1]  # activations about linear in the patches
    assert memory.image_bytes(SimpleNamespace(images=None, device=CPU)) == 0


def test_the_reservation_comes_off_the_kv_pool(monkeypatch):
    """On CUDA the KV budget is what ``mem_fraction`` leaves after the forward's peak and the
    tower's largest call (faked here: the forward's peak and the device's size; the tower's bytes
    are measured on the CPU)."""
    monkeypatch.setattr(memory, "profile_forward", lambda engine: 1 << 20)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, 1 << 30))
    monkeypatch.setattr(memory, "peak_bytes",
                        lambda fn, device, real=memory.peak_bytes: real(fn, CPU))
    config = SimpleNamespace(page_size=1, mem_fraction=0.5, max_running_reqs=4096)

    def budget(max_tokens: int | None) -> float:
        engine = SimpleNamespace(config=config, device=SimpleNamespace(type="cuda"),
                                 state_pool=None, kernels=None,
                                 images=_encoder(max_tokens) if max_tokens else None)
        return memory.kv_budget(engine)  # type: ignore[arg-type]

    none, small, large = budget(None), budget(16), budget(256)
    assert none == (1 << 29) - (1 << 20)
    assert none > small > large
    reserved = memory.image_bytes(SimpleNamespace(images=_encoder(256), device=CPU))
    assert none - large == reserved


class _KeptPeaks:
    """The kernel warm-up's side of the kept peaks (``CompilingKernels``)."""

    def __init__(self, peaks: dict[str, int] | None) -> None:
        self.peaks, self.kept = peaks, []

    def known_peaks(self) -> dict[str, int] | None:
        return self.peaks

    def keep_peaks(self, peaks: dict[str, int]) -> None:
        self.kept.append(peaks)


def test_peaks_kept_by_an_earlier_start_replace_the_measurement(monkeypatch):
    """A start whose kernel cache kept the peaks sizes the pool from them, running neither the
    forward nor the tower; one without measures both and hands them on to be kept."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (0, 1 << 30))
    monkeypatch.setattr(memory, "profile_forward", lambda engine: 1 << 20)
    monkeypatch.setattr(memory, "peak_bytes", lambda fn, device: 1 << 22)
    config = SimpleNamespace(page_size=1, mem_fraction=0.5, max_running_reqs=4096)

    def engine(kernels):
        return SimpleNamespace(config=config, device=SimpleNamespace(type="cuda"),
                               state_pool=None, kernels=kernels, images=_encoder(16))

    fresh = _KeptPeaks(None)
    assert memory.kv_budget(engine(fresh)) == (1 << 29) - (1 << 20) - (1 << 22)  # type: ignore[arg-type]
    assert fresh.kept == [{"forward": 1 << 20, "tower": 1 << 22}]

    def measured(*args):
        raise AssertionError("measured although the peaks were kept")

    monkeypatch.setattr(memory, "profile_forward", measured)
    monkeypatch.setattr(memory, "peak_bytes", measured)
    kept = _KeptPeaks({"forward": 3 << 20, "tower": 1 << 21})
    assert memory.kv_budget(engine(kept)) == (1 << 29) - (3 << 20) - (1 << 21)  # type: ignore[arg-type]
    assert kept.kept == []


def _prompt(tokens: list[int]) -> MultimodalPrompt:
    """Images of ``tokens`` tokens (1 x 2k grids of merged tokens), one after another."""
    ids, images = [5], []
    for k, n in enumerate(tokens):
        images.append(ImageInput(b"", (0,), (1, 2, 2 * n), len(ids), n, f"{k:032x}",
                                 field=f"messages[0].content[{k}].image_url"))
        ids += [IMAGE] * n + [5]
    return MultimodalPrompt(ids, images, IMAGE)


def test_an_image_above_the_limit_is_refused_naming_its_field():
    encoder, backend = _encoder(24), SimpleNamespace(supports_image_blocks=True)
    mm = _prompt([24, 8])
    encoder.check(mm.input_ids, mm, backend)  # type: ignore[arg-type]
    mm = _prompt([8, 25])
    with pytest.raises(MediaError) as e:
        encoder.check(mm.input_ids, mm, backend)  # type: ignore[arg-type]
    assert e.value.param == "messages[0].content[1].image_url"
    assert "25 tokens, more than the 24" in str(e.value) and "--max-image-tokens" in str(e.value)


def test_a_step_encodes_in_calls_within_the_limit():
    encoder = _encoder(24)
    images = _prompt([10, 10, 4, 24, 1, 23]).images
    calls = encoder._calls(images)
    assert [[i.num_tokens for i in call] for call in calls] == [[10, 10, 4], [24], [1, 23]]
