"""Images in the tokenizer worker (``minisgl.multimodal``): decoding PNG, JPEG, WebP and a GIF's
first frame, the checkpoint's preprocessing and the placeholder expansion, against transformers'
own processors (pixel values and token ids identical) for Qwen3.5, Qwen3.5-MoE, Gemma 3 and
Gemma 4; and every bad image a ``MediaError`` naming its field."""

from __future__ import annotations

import io

import numpy as np
import pytest

from helpers.vision_models import make_vision_checkpoint
from minisgl.multimodal.config import MediaOptions
from minisgl.multimodal.decode import decode_image
from minisgl.multimodal.items import ImageItem, MediaError
from minisgl.multimodal.mrope import mrope_positions
from minisgl.multimodal.processor import ImageProcessor

ARCHS = ("qwen3_5", "qwen3_5_moe", "gemma3", "gemma4")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    return {arch: make_vision_checkpoint(arch, root / arch) for arch in ARCHS}


def encoded(fmt: str, size: tuple[int, int], seed: int = 0, mode: str = "RGB") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    h, w = size
    pixels = rng.integers(0, 256, (h, w, 4 if mode == "RGBA" else 3), dtype=np.uint8)
    image = Image.fromarray(pixels, mode)
    buf = io.BytesIO()
    if fmt == "GIF":  # two frames: the first is the one served
        second = Image.fromarray(255 - pixels[..., :3])
        image.convert("RGB").save(buf, "GIF", save_all=True, append_images=[second])
    else:
        image.save(buf, fmt)
    return buf.getvalue()


def reference(path, arch: str, text: str, blobs: list[bytes]):
    """transformers' processor of the checkpoint on the same text and images (PIL decodes)."""
    import transformers as tf
    from PIL import Image
    from transformers.processing_utils import ProcessorMixin

    tok = tf.AutoTokenizer.from_pretrained(path)
    images = [Image.open(io.BytesIO(b)) for b in blobs]
    # Qwen's and Gemma 4's processors insist on their video/audio parts, which need torchvision
    check = ProcessorMixin.check_argument_for_proper_class
    ProcessorMixin.check_argument_for_proper_class = lambda *a, **k: None
    try:
        if arch.startswith("qwen"):
            proc = tf.Qwen3VLProcessor(tf.Qwen2VLImageProcessorPil.from_pretrained(path), tok,
                                       None)
        elif arch == "gemma3":
            proc = tf.Gemma3Processor(tf.Gemma3ImageProcessorPil.from_pretrained(path), tok,
                                      image_seq_length=16)
        else:
            proc = tf.Gemma4Processor(None, tf.Gemma4ImageProcessorPil.from_pretrained(path),
                                      tok, None)
    finally:
        ProcessorMixin.check_argument_for_proper_class = check
    return proc(text=[text], images=images, return_tensors="np", add_special_tokens=False)


def ours(path, text: str, blobs: list[bytes], opts: MediaOptions | None = None):
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(path)
    proc = ImageProcessor.for_model(str(path), tok, opts)
    items = [ImageItem(b, f"messages[0].content[{i}].image_url") for i, b in enumerate(blobs)]
    return proc, proc.prompt(text, items, lambda t: tok.encode(t, add_special_tokens=False))


def chat_text(path, n_images: int) -> str:
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(path)
    parts = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": "What?"}]
    messages = [{"role": "user", "content": parts}]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


IMAGES = {  # formats and sizes: one image, then two of different shapes
    1: [("PNG", (37, 53), "RGB")],
    2: [("JPEG", (64, 40), "RGB"), ("WEBP", (30, 90), "RGB")],
    3: [("GIF", (45, 45), "RGB"), ("PNG", (50, 33), "RGBA")],
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", sorted(IMAGES))
def test_matches_transformers_processor(checkpoints, arch, case):
    path = checkpoints[arch]
    blobs = [encoded(f, s, seed=i, mode=m) for i, (f, s, m) in enumerate(IMAGES[case])]
    text = chat_text(path, len(blobs))
    ref = reference(path, arch, text, blobs)
    proc, prompt = ours(path, text, blobs)
    assert prompt.input_ids == ref["input_ids"][0].tolist()
    pixels = [np.frombuffer(i.pixel_values, np.float32).reshape(i.shape) for i in prompt.images]
    if arch.startswith("qwen"):
        np.testing.assert_array_equal(np.concatenate(pixels), ref["pixel_values"])
        assert [list(i.grid) for i in prompt.images] == ref["image_grid_thw"].tolist()
        types = ref["mm_token_type_ids"][0]
        _, delta = mrope_positions(prompt.input_ids, prompt.image_token_id,
                                   [i.grid for i in prompt.images], 2)
        assert prompt.mrope_delta == delta
    elif arch == "gemma3":
        np.testing.assert_array_equal(np.stack(pixels), ref["pixel_values"])
        types = ref["token_type_ids"][0]
    else:
        real = (ref["image_position_ids"] >= 0).all(-1)
        for mine, theirs, mask in zip(pixels, ref["pixel_values"], real):
            np.testing.assert_array_equal(mine, theirs[mask])
        types = ref["mm_token_type_ids"][0]
    # every image's run starts where transformers marks its image tokens
    starts = [i for i in range(len(types)) if types[i] and (i == 0 or not types[i - 1])]
    assert [i.offset for i in prompt.images] == starts
    assert sum(i.num_tokens for i in prompt.images) == int(types.sum())
    assert len({i.digest for i in prompt.images}) == len(blobs)


def test_same_image_same_digest(checkpoints):
    path = checkpoints["qwen3_5"]
    blob = encoded("PNG", (40, 40), seed=3)
    _, prompt = ours(path, chat_text(path, 2), [blob, blob])
    a, b = prompt.images
    assert a.digest == b.digest and a.offset != b.offset


def test_placeholder_in_text_is_refused(checkpoints):
    path = checkpoints["qwen3_5"]
    text = chat_text(path, 1).replace("What?", "What is <|image_pad|>?")
    with pytest.raises(MediaError, match="holds 2 image placeholders") as e:
        ours(path, text, [encoded("PNG", (32, 32))])
    assert e.value.param == "messages"


def test_text_model_has_no_processor(tmp_path):
    from helpers.hf_models import make_tiny_checkpoint

    path = make_tiny_checkpoint("qwen3", tmp_path / "qwen3")
    assert ImageProcessor.for_model(str(path), object()) is None


FIELD = "messages[1].content[2].image_url"


def _truncated() -> bytes:
    return encoded("PNG", (64, 64))[:300]


def _bmp() -> bytes:
    return encoded("BMP", (8, 8))


@pytest.mark.parametrize("data, fragment", [
    (b"not an image at all", "not a readable image"),
    (b"", "not a readable image"),
    (_truncated(), "corrupt or truncated"),
    (_bmp(), "BMP images are not supported"),
])
def test_bad_images_name_their_field(data, fragment):
    with pytest.raises(MediaError, match=fragment) as e:
        decode_image(data, FIELD, 1 << 20)
    assert e.value.param == FIELD and str(e.value).startswith(FIELD + ": ")


def test_too_many_pixels_is_refused_before_decoding():
    with pytest.raises(MediaError, match="100 x 80 pixels, more than the 7999 allowed"):
        decode_image(encoded("PNG", (80, 100)), FIELD, 7999)
    decode_image(encoded("PNG", (80, 100)), FIELD, 8000)


def test_extreme_aspect_ratio_is_a_media_error(checkpoints):
    path = checkpoints["qwen3_5"]
    with pytest.raises(MediaError, match="cannot be preprocessed") as e:
        ours(path, chat_text(path, 1), [encoded("PNG", (2, 600))])
    assert e.value.param == "messages[0].content[0].image_url"


def test_background_load_serves_the_same_and_reports_a_failed_load(checkpoints, tmp_path):
    """The tokenizer worker loads the image processor on a thread (ready without waiting for it):
    the first image request waits for it and gets the same prompt; a load that failed fails
    every image request with its reason."""
    import shutil

    import transformers as tf

    path = checkpoints["qwen3_5"]
    tok = tf.AutoTokenizer.from_pretrained(path)
    text, blobs = chat_text(path, 1), [encoded("PNG", (37, 53))]
    items = [ImageItem(blobs[0], "messages[0].content[0].image_url")]
    encode = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    late = ImageProcessor.for_model(str(path), tok, background=True)
    assert late.prompt(text, items, encode).input_ids == ours(path, text, blobs)[1].input_ids
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    (broken / "preprocessor_config.json").write_text("{not json")
    late = ImageProcessor.for_model(str(broken), tok, background=True)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="^the image processor failed to load: "):
            late.prompt(text, items, encode)
