"""Shipped choices of autotuned kernels (``kernel/autotune_choices.py``): a seeded key is not
tuned (no configuration is timed) and runs the chosen configuration; what a process chose dumps
to the table that seeds it; a choice the kernel no longer offers, or a key that does not read
back, is skipped (tuned as before); no table shipped for a GPU seeds nothing."""

from __future__ import annotations

import pytest
import torch

from helpers import autotuned
from minisgl.kernel import autotune_choices as choices

PACKAGE = "helpers.autotuned"
NAME = "helpers.autotuned:add_one_kernel"


@pytest.fixture
def tuner():
    t = autotuned.add_one_kernel
    t.cache.clear()
    yield t
    t.cache.clear()


def _key(n: int) -> str:  # what Triton's autotuner keys a call by: ``key``'s values, then dtypes
    return repr((n, "torch.float32", "torch.float32"))


def test_a_seeded_key_runs_its_choice_untimed(tuner, monkeypatch):
    wide = next(c for c in tuner.configs if c.kwargs["BLOCK"] == 32)
    table = {NAME: [[_key(40), dict(choices._settings(wide))]]}
    assert dict(choices.autotuners(PACKAGE)) == {NAME: tuner}
    assert choices.seed(table, PACKAGE) == 1

    def timed(*args, **kwargs):
        raise AssertionError("a seeded key was timed")

    monkeypatch.setattr(tuner, "_bench", timed)
    x = torch.arange(40, dtype=torch.float32)
    assert torch.equal(autotuned.add_one(x), x + 1)
    assert tuner.best_config is wide
    assert choices.dump(PACKAGE) == table  # what it ran with is what a dump ships
    assert choices.seed(table, PACKAGE) == 0  # a key already chosen is left alone


def test_choices_it_cannot_use_are_skipped(tuner):
    narrow = next(c for c in tuner.configs if c.kwargs["BLOCK"] == 16)
    gone = {**dict(choices._settings(narrow)), "BLOCK": 64}  # a configuration no longer offered
    table = {NAME: [[_key(40), gone], ["torch.float32", dict(choices._settings(narrow))]],
             "helpers.autotuned:not_a_kernel": [[_key(40), dict(choices._settings(narrow))]]}
    assert choices.seed(table, PACKAGE) == 0 and not tuner.cache


def test_no_table_for_a_gpu_seeds_nothing():
    assert not choices.table_path("No Such GPU", "fla").exists()
    assert choices.seed_shipped("fla", "No Such GPU") == 0
