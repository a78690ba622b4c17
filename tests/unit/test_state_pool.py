"""The recurrent-state slot pool: shapes, sizes, snapshot slots and their integrity check."""

from __future__ import annotations

import pytest
import torch

from minisgl.kvcache.state_pool import StatePool, StateShape

SHAPE = StateShape(conv_dim=12, conv_width=4, v_heads=2, k_dim=4, v_dim=3)


def test_layout_and_bytes() -> None:
    pool = StatePool(SHAPE, num_layers=3, max_running_reqs=4, num_snapshots=2,
                     dtype=torch.bfloat16, device="cpu")
    conv, ssm = pool.layer(2)
    assert conv.shape == (7, 12, 3) and conv.dtype == torch.bfloat16
    assert ssm.shape == (7, 2, 4, 3) and ssm.dtype == torch.float32
    assert pool.scratch_slot == 4
    per_slot = 3 * (12 * 3 * 2 + 2 * 4 * 3 * 4)
    assert pool.bytes_per_slot == per_slot and pool.total_bytes == 7 * per_slot
    assert SHAPE.bytes_per_slot(torch.bfloat16) * 3 * 7 == pool.total_bytes


def test_snapshots_and_integrity() -> None:
    pool = StatePool(SHAPE, 2, max_running_reqs=2, num_snapshots=2, dtype=torch.float32,
                     device="cpu")
    a, b = pool.alloc_snapshot(), pool.alloc_snapshot()
    assert {a, b} == {3, 4} and pool.alloc_snapshot() is None
    pool.check_integrity([a, b])
    pool.ssm[1][0].fill_(2.0)
    pool.conv[0][0].fill_(3.0)
    pool.copy_slot(a, 0)
    assert pool.ssm[1][a].eq(2.0).all() and pool.conv[0][a].eq(3.0).all()
    pool.free_snapshot(a)
    pool.check_integrity([b])
    with pytest.raises(AssertionError, match="leaked"):
        pool.check_integrity([])
    with pytest.raises(AssertionError):
        pool.free_snapshot(a)  # twice
    with pytest.raises(AssertionError):
        pool.free_snapshot(1)  # a request's slot, not a snapshot


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match="max_running_reqs"):
        StatePool(SHAPE, 1, 0, 0, torch.float32, "cpu")
    with pytest.raises(ValueError, match="num_snapshots"):
        StatePool(SHAPE, 1, 1, -1, torch.float32, "cpu")


def test_draft_slots_follow_the_snapshots_and_copy_in_one_go() -> None:
    """Speculative decoding's draft groups lie after the snapshot slots (never handed out as
    snapshots); ``copy_slots`` copies many pairs, every layer."""
    pool = StatePool(SHAPE, 2, max_running_reqs=2, num_snapshots=2, dtype=torch.float32,
                     device="cpu", num_draft_groups=2, draft_group_size=3)
    assert pool.num_slots == 3 + 2 + 6 and pool.first_draft_slot == 5
    assert [pool.draft_slot(g) for g in (0, 1)] == [5, 8]
    snaps = [pool.alloc_snapshot(), pool.alloc_snapshot()]
    assert set(snaps) == {3, 4} and pool.alloc_snapshot() is None
    pool.check_integrity(snaps)
    for t in pool.conv + pool.ssm:
        t.copy_(torch.randn_like(t))
    before = [t.clone() for t in pool.conv + pool.ssm]
    pool.copy_slots([0, 1], [7, 9])
    for t, old in zip(pool.conv + pool.ssm, before):
        assert torch.equal(t[0], old[7]) and torch.equal(t[1], old[9])
        assert torch.equal(t[2:], old[2:])
