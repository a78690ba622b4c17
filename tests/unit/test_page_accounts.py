"""A page space's integrity check: the counts always (the serving loop's, once it goes idle),
no page in two places only when thorough (a sort of the whole pool: the tests')."""

import pytest
import torch

from minisgl.scheduler.pages import PageSpace


def _space() -> PageSpace:
    return PageSpace(num_pages=9, page_size=2, page_table=torch.zeros(2, 16, dtype=torch.int32))


@pytest.mark.parametrize("thorough", [True, False])
def test_a_lost_page_fails_either_check(thorough):
    space = _space()
    taken = space.free.take(3)
    space.check_integrity([taken], thorough=thorough)
    with pytest.raises(AssertionError, match="leaked: 14 accounted of 16"):
        space.check_integrity([taken[:2]], thorough=thorough)
    space.check_integrity([taken[:1]], cached_tokens=4, thorough=thorough)  # two in a tree


def test_a_page_held_twice_fails_only_the_thorough_check():
    space = _space()
    taken = space.free.take(3)
    twice = [taken[:2], taken[:1]]  # the third page lost, the first held twice: the counts agree
    space.check_integrity(twice, thorough=False)
    with pytest.raises(AssertionError, match="owned twice"):
        space.check_integrity(twice)
