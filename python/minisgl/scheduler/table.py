from __future__ import annotations


class TableManager:
    """Hands out page-table rows, one per live request. The last row is the dummy (never given)."""

    def __init__(self, max_running_reqs: int) -> None:
        self.size = max_running_reqs
        self._free = list(range(max_running_reqs - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def dummy_row(self) -> int:
        return self.size

    def allocate(self) -> int:
        return self._free.pop()

    def free(self, row: int) -> None:
        assert 0 <= row < self.size and row not in self._free, f"bad page-table row {row}"
        self._free.append(row)
