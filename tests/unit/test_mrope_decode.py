"""A decode token's M-RoPE is plain RoPE at ``index + delta``: its three positions are equal, and
with equal positions every frequency turns by the same position, whichever section it belongs to
(Qwen3.5's interleaved layout and Qwen2-VL's contiguous one alike). So the decode CUDA graph
takes each request's delta as a shift of its 1-D position (``engine/graph.py``, row 5 of its
inputs, which ``gather_inputs`` adds: ``tests/kernels/test_decode_step_kernels.py``) and reads the
ordinary rotary table. Checked here: the table rows against ``mrope_cos_sin`` for the released
Qwen3.5 rope parameters, and the graph's host inputs (index and shift) against the positions the
eager path gives the same decode rows (``engine/images.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers.mrope_prompts import IMAGE, MERGE, mrope_prompt
from minisgl.core import Batch, Feed, Req, SamplingParams
from minisgl.engine.graph import GraphRunner
from minisgl.engine.images import ImageEncoder
from minisgl.layers.rotary import cos_sin_cache, mrope_cos_sin
from minisgl.models.config import rotary_config
from minisgl.multimodal.mrope import mrope_positions
from minisgl.multimodal.prompt import ImageInput, MultimodalPrompt

# Qwen3.5 / Qwen3.6 releases (config.json's text_config): 64 rotated dims of head_dim 256
QWEN35_ROPE = {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
               "rope_theta": 10000000, "partial_rotary_factor": 0.25}


@pytest.mark.parametrize("interleaved", [True, False])
def test_equal_positions_are_the_rotary_table(interleaved):
    cfg = rotary_config({"rope_parameters": {**QWEN35_ROPE, "mrope_interleaved": interleaved}},
                        64, 70_000)
    assert cfg.mrope == ((11, 11, 10), interleaved) and cfg.scaling is None
    index = torch.tensor([0, 1, 17, 4095, 65_535, 69_999])
    table = cos_sin_cache(cfg, torch.device("cpu"))
    same = torch.cat(mrope_cos_sin(cfg, index.expand(3, -1)), dim=-1)
    assert torch.equal(same, table[index])
    # an image token's positions differ per axis: then the sections matter (not vacuous)
    grid = torch.stack([index, index + 1, index + 2])
    assert not torch.equal(torch.cat(mrope_cos_sin(cfg, grid), dim=-1), table[index])


def _request(uid: int, pieces: list, generated: int) -> Req:
    """A request whose prompt is ``pieces`` (text lengths, image grids) with ``generated``
    tokens after it, in decode (its next token at the last index)."""
    ids, grids = mrope_prompt(pieces)
    prompt_len = len(ids)
    mm = None
    if grids:
        _, delta = mrope_positions(ids, IMAGE, grids, MERGE)
        offsets = [i for i, t in enumerate(ids) if t == IMAGE and (i == 0 or ids[i - 1] != IMAGE)]
        images = [ImageInput(b"", (0,), g, o, g[0] * g[1] * g[2] // MERGE ** 2, f"{uid:032x}")
                  for g, o in zip(grids, offsets)]
        mm = MultimodalPrompt(list(ids), images, IMAGE, delta)
    ids += [7] * generated
    return Req(uid=uid, input_ids=ids, prompt_len=prompt_len, sampling_params=SamplingParams(),
               max_device_len=len(ids) + 8, table_idx=uid, cached_len=len(ids) - 1,
               device_len=len(ids), mm=mm)


def test_graph_inputs_give_the_eager_positions():
    """A decode batch of a request with a large image (delta < 0), one with two images of one
    merged row each (delta 0: such an image takes as many positions as tokens), a text request
    and one just past its prompt: the graph's index + shift is each of the three positions the
    eager forward gives the same rows."""
    reqs = [_request(0, [3, (1, 16, 20), 4], 5), _request(1, [2, (1, 2, 2), 1, (1, 4, 2), 3], 1),
            _request(2, [9], 3), _request(3, [1, (1, 6, 8), 2], 0)]
    batch = Batch([Feed(r, r.cached_len, r.device_len) for r in reqs], "decode")
    encoder = ImageEncoder(torch.nn.Identity(), IMAGE, torch.device("cpu"), mrope=True,
                           merge=MERGE)
    eager = encoder._mrope_positions(batch.feeds, batch.size).numpy()
    shifts = encoder.decode_shifts(batch)
    assert shifts is not None and shifts[0] < shifts[3] < 0 == shifts[1] == shifts[2]
    assert shifts == [r.mm.mrope_delta if r.mm else 0 for r in reqs]
    runner = GraphRunner.__new__(GraphRunner)  # its host inputs only: no model, no device
    runner.dummy_row = 9
    runner.ctx = SimpleNamespace(attn_backend=SimpleNamespace(replay_metadata=lambda b, n: []))
    inputs = runner._host_inputs(batch, 8, False, shifts, pin=False)
    assert inputs.shape == (6, 8) and inputs[5, 4:].eq(0).all()  # padding rows: no shift
    graph = (inputs[1] + inputs[5])[:batch.size].numpy()
    for axis in range(3):
        np.testing.assert_array_equal(graph, eager[axis])
    text = Batch([Feed(reqs[2], reqs[2].cached_len, reqs[2].device_len)], "decode")
    assert encoder.decode_shifts(text) is None  # a text batch sends no shifts (all 0)
