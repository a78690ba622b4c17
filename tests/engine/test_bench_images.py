"""``benchmark/offline/bench_images.py`` end to end at toy size on the CPU (its GPU run is
``scripts/gpu_validate.sh images``), and the Qwen3.5 model directory ``dummy_model.py`` writes for
it: chat text and the image placeholder tokenize, and an image expands to its tokens."""

from __future__ import annotations

import importlib.util
import io
import json
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
QWEN35 = os.path.join(ROOT, "benchmark", "configs", "qwen3.5-0.8b.json")


def _load(*parts: str):
    spec = importlib.util.spec_from_file_location(parts[-1][:-3], os.path.join(ROOT, *parts))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a tokenizer of 248k tokens written and loaded
def test_qwen_dummy_model_takes_text_and_images(tmp_path):
    """transformers imposes Qwen3_5Tokenizer (bytes before BPE) on the directory: the chat's text
    is its bytes, the vision tokens are the config's ids, and a 256 x 256 image is 64 tokens (16
    x 16 patches of 16 pixels, merged 2 x 2)."""
    from helpers.vision_reference import random_image
    from minisgl.multimodal.items import ImageItem
    from minisgl.multimodal.processor import ImageProcessor
    from minisgl.utils.hf import load_tokenizer

    dummy = _load("benchmark", "online", "dummy_model.py")
    path = dummy.write_dummy_model(QWEN35, str(tmp_path / "qwen"))
    raw = json.load(open(QWEN35))
    tok = load_tokenizer(path)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[:6] == [248045, *b"user\n"]
    assert ids[6:11] == [raw["vision_start_token_id"], raw["image_token_id"],
                         raw["vision_end_token_id"], *b"Hi"]
    assert tok.decode([300, 301]) == "t300t301"
    processor = ImageProcessor.for_model(path, tok)
    buf = io.BytesIO()
    random_image(256, 256, seed=0).save(buf, format="PNG")
    prompt = processor.prompt(text, [ImageItem(buf.getvalue(), "messages[0].content[0]")],
                              lambda t: tok.encode(t, add_special_tokens=False))
    assert prompt.images[0].num_tokens == 64 and prompt.images[0].grid == (1, 16, 16)
    assert prompt.input_ids.count(raw["image_token_id"]) == 64


@pytest.mark.slow
def test_bench_images_runs_on_cpu(tmp_path):
    """Two chats of a 256 x 256 image, minisgl and transformers: the result files hold every
    field the table reads."""
    bench = _load("benchmark", "offline", "bench_images.py")
    path = bench.main(["--model", QWEN35, "--device", "cpu", "--shrink", "--image-size", "256",
                       "--chats", "2", "--max-tokens", "2", "--runs", "1",
                       "--out", str(tmp_path)])
    assert os.path.basename(path) == "offline_images_qwen3.5-0.8b-tiny_cpu.json"
    records = json.load(open(path))
    assert [r["engine"] for r in records] == ["minisgl", "transformers"]
    for r in records:
        assert r["image_tokens"] == 64 and r["chats"] == 2 and r["output_tokens"] == 4
        assert r["ttft_ms"] > 0 and 0 < r["encoder_ms"] < r["ttft_ms"]
        assert 0 < r["encoder_share"] < 1 and r["output_tok_per_s"] > 0
        assert set(r["batch_ttft_s"]) == {"p50", "p90", "max"} and r["commit"]
    assert records[0]["images_encoded"] == 2  # each chat's own image went through the tower
    table = open(path.replace(".json", ".md")).read()
    assert "| minisgl |" in table and "| transformers |" in table
