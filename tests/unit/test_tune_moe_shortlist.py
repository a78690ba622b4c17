"""``benchmark/kernels/tune_moe.py --shortlist``: the tiles other GPUs' tables pick near a token
count, each once, are what a new GPU's short tuning times."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmark", "kernels"))
import tune_moe  # noqa: E402

A = [32, 128, 128, 64, 1, 8, 5, True, 64]
B = [128, 128, 128, 64, 1, 8, 5, True, 128]
C = [1, 16, 16, 64, 1, 1, 1, True]


def table(path, picks):
    buckets = [dict(max_rows=0, config=cfg, tokens=t, us=1.0) for t, cfg in picks]
    path.write_text(json.dumps(dict(gpu="x", buckets=buckets)))


def test_picks_near_the_count_from_every_table_once(tmp_path, monkeypatch):
    monkeypatch.setattr(tune_moe, "DIR", tmp_path)
    table(tmp_path / "gpu-a_mxfp4_gluon_N5760_K2880.json", [(1, C), (256, A), (2048, B)])
    table(tmp_path / "gpu-b_mxfp4_gluon_N5760_K2880.json", [(128, A), (512, B)])
    table(tmp_path / "gpu-c_mxfp4_N5760_K2880.json", [(256, C)])  # another format
    table(tmp_path / "gpu-d_mxfp4_gluon_N1408_K2816.json", [(256, C)])  # another shape
    got = tune_moe.shortlist(256, "mxfp4_gluon", 5760, 2880)
    # A once (both tables pick it), B at 512 tokens; 1 and 2,048 lie beyond a factor of four
    assert got == [tune_moe.MoeConfig(*A), tune_moe.MoeConfig(*B)]
    assert tune_moe.shortlist(4096, "mxfp4_gluon", 5760, 2880)[0].block_m == 128
    assert tune_moe.shortlist(4, "mxfp4", 5760, 2880) == []
