"""The free KV pages: the never-used ones as one tensor, and the freed ones as the chunks they were
freed in.

Freeing appends a chunk and taking reads the newest chunks first, so either costs the pages it
moves. A single tensor would have to be concatenated on every free, copying the whole list: with
page size 1 a GPU engine has millions of pages, and a verify step that rejects drafts frees a
page or two every step (``minisgl/speculative/``): that copy cost as much as the rest of the
step's bookkeeping (docs/performance.md, "Measurements behind the code").
"""

from __future__ import annotations

import torch


class FreePages:
    def __init__(self, pages: torch.Tensor) -> None:
        self.fresh = pages  # never handed out (a view that shrinks from the front)
        self.freed: list[torch.Tensor] = []  # newest last
        self.num_freed = 0

    def __len__(self) -> int:
        return len(self.fresh) + self.num_freed

    def put(self, pages: torch.Tensor) -> None:
        if len(pages):
            self.freed.append(pages.to(torch.int32))
            self.num_freed += len(pages)

    def take(self, n: int) -> torch.Tensor:
        """``n`` pages, the most recently freed first (``RuntimeError`` if there are fewer)."""
        if n > len(self):
            raise RuntimeError(f"out of KV pages: need {n}, have {len(self)}")
        parts, want = [], n
        while want and self.freed:
            last = self.freed[-1]
            if len(last) <= want:
                parts.append(self.freed.pop())
            else:
                parts.append(last[len(last) - want:])
                self.freed[-1] = last[: len(last) - want]
            want -= len(parts[-1])
        self.num_freed -= n - want
        if want:
            parts.append(self.fresh[:want])
            self.fresh = self.fresh[want:]
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts) if parts else self.fresh[:0]

    def all(self) -> torch.Tensor:
        """Every free page (integrity checks)."""
        return torch.cat([self.fresh, *self.freed])
