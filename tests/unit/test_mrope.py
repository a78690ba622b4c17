"""Qwen3.5's multimodal rotary positions (``minisgl.multimodal.mrope``) against transformers':
``get_rope_index`` for prompts with zero, one and two images of different grids, the decode
positions after them, and the rotary angles of ``Qwen3_5TextRotaryEmbedding``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.mrope_prompts import IMAGE, MERGE, mrope_prompt
from minisgl.multimodal.mrope import decode_positions, mrope_angles, mrope_positions


@pytest.fixture(scope="module")
def hf_model():
    import transformers as tf

    from helpers.vision_models import QWEN_VISION

    text = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, vocab_size=128,
                layer_types=["full_attention"],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": 1.0, "mrope_section": [3, 3, 2],
                                 "mrope_interleaved": True})
    cfg = tf.Qwen3_5Config(text_config=text, vision_config=QWEN_VISION, image_token_id=IMAGE)
    return tf.Qwen3_5Model(cfg).eval()


CASES = [
    [7],
    [3, (1, 8, 8), 4],
    [2, (1, 4, 12), 3, (1, 10, 6), 5],
    [(1, 6, 4), 1],  # an image at the start
    [4, (2, 4, 4), 2],  # two frames
]


@pytest.mark.parametrize("pieces", CASES)
def test_positions_match_get_rope_index(hf_model, pieces):
    ids, grids = mrope_prompt(pieces)
    ours, delta = mrope_positions(ids, IMAGE, grids, MERGE)
    input_ids = torch.tensor([ids])
    types = (input_ids == IMAGE).int()
    grid = torch.tensor(grids) if grids else None
    ref, ref_delta = hf_model.get_rope_index(input_ids, types, image_grid_thw=grid)
    np.testing.assert_array_equal(ours, ref[:, 0].numpy())
    assert delta == int(ref_delta)
    # decode: transformers' positions of the tokens after the prompt are cache length + delta
    n = len(ids)
    for step in range(3):
        np.testing.assert_array_equal(decode_positions(n + step, delta),
                                      np.full(3, n + step + int(ref_delta)))


def test_adjacent_images_each_on_their_own_grid():
    """Images with no token between them (transformers would take them for one run; Qwen's
    template always puts ``<|vision_end|><|vision_start|>`` between)."""
    ids, grids = mrope_prompt([(1, 6, 4), (1, 2, 2), 1])
    pos, delta = mrope_positions(ids, IMAGE, grids, MERGE)
    first = pos[:, :6]  # 3 x 2 tokens at start 0
    np.testing.assert_array_equal(first[1], [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(first[2], [0, 1, 0, 1, 0, 1])
    np.testing.assert_array_equal(pos[:, 6], [3, 3, 3])  # the next image starts at max(3, 2)
    np.testing.assert_array_equal(pos[:, 7], [4, 4, 4])
    assert delta == 5 - 8


def test_mismatched_images_are_refused():
    ids, grids = mrope_prompt([2, (1, 4, 4), 2])
    with pytest.raises(ValueError, match="no run of 16 image tokens"):
        mrope_positions(ids, IMAGE, [(1, 8, 8)], MERGE)
    with pytest.raises(ValueError, match="more image tokens"):
        mrope_positions(ids, IMAGE, [], MERGE)


@pytest.mark.parametrize("interleaved", [True, False])
def test_angles_match_the_text_rotary(hf_model, interleaved):
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    rotary = Qwen3_5TextRotaryEmbedding(hf_model.config.text_config)
    ids, grids = mrope_prompt([2, (1, 4, 12), 3, (1, 10, 6), 5])
    pos, _ = mrope_positions(ids, IMAGE, grids, MERGE)
    positions = torch.from_numpy(pos)
    section = rotary.mrope_section
    angles = mrope_angles(positions, rotary.inv_freq, section, interleaved)
    if interleaved:
        cos, _ = rotary(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
        torch.testing.assert_close(torch.cat([angles, angles], -1).cos(), cos[0])
    else:  # Qwen2-VL's layout: contiguous sections
        bounds = np.cumsum([0, *section])
        for axis in range(3):
            sl = slice(bounds[axis], bounds[axis + 1])
            torch.testing.assert_close(angles[:, sl], positions[axis, :, None].float()
                                       * rotary.inv_freq[sl])
    # text tokens turn as plain RoPE
    torch.testing.assert_close(angles[:2], torch.arange(2)[:, None] * rotary.inv_freq)
