"""The global trie of suffix decoding (``suffix.py``): every suffix, cut to ``depth`` tokens, of
the last ``capacity`` finished requests' outputs, with a count per node (how many times its token
sequence occurred).

Nodes are ids into flat lists: ``children[i]`` maps a token to a child's id and ``count[i]`` is
node i's count (node 0 the root). Lists of ints and int-to-int dicts are invisible to Python's
garbage collector, whereas a trie of node objects (hundreds of thousands after a few hundred
answers) was walked by every full collection, a pause of every request.
The ids of removed nodes are reused; ``removals`` counts removals, after which ids held elsewhere
(``SuffixProposer``'s matched nodes) may name other nodes and must be matched again.

Learning a text costs O(n D) dictionary operations (several decode steps of a small model for a
long answer), so it is queued and done in slices in the host's spare
time (``learn``: while a forward computes, or when the scheduler is idle); so is forgetting the
oldest text.
"""

from __future__ import annotations

from collections import deque

# texts waiting to be learned beyond which the oldest waiting one is dropped (the host never had
# the spare time for them)
MAX_WAITING = 64


class SuffixTrie:
    def __init__(self, depth: int, capacity: int) -> None:
        self.depth, self.capacity = depth, capacity
        self.children: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self.free: list[int] = []
        self.texts: deque[list[int]] = deque()  # learned, oldest first
        # (text, +1 learn / -1 forget, suffixes done): the work ``learn`` does in slices
        self.jobs: deque[list] = deque()
        self.removals = 0

    def add(self, tokens: list[int]) -> None:
        """Queue a finished request's output to be learned (``learn``)."""
        if not tokens:
            return
        self.jobs.append([tokens, +1, 0])
        waiting = [job for job in self.jobs if job[1] > 0 and job[2] == 0]
        if len(waiting) > MAX_WAITING:
            self.jobs.remove(waiting[0])

    def learn(self, budget: int | None = None) -> bool:
        """Do up to ``budget`` suffixes of the queued work (None: all of it); whether some is
        left."""
        while self.jobs and (budget is None or budget > 0):
            job = self.jobs[0]
            tokens, delta, done = job
            stop = len(tokens) if budget is None else min(len(tokens), done + budget)
            self._update(tokens, done, stop, delta)
            if budget is not None:
                budget -= stop - done
            job[2] = stop
            if stop < len(tokens):
                break
            self.jobs.popleft()
            if delta > 0:
                self.texts.append(tokens)
                if len(self.texts) > self.capacity:
                    self.jobs.appendleft([self.texts.popleft(), -1, 0])
        return bool(self.jobs)

    def _update(self, tokens: list[int], start: int, stop: int, delta: int) -> None:
        children, count = self.children, self.count
        if delta < 0:
            self.removals += 1
        for s in range(start, stop):
            node = 0
            for token in tokens[s : s + self.depth]:
                child = children[node].get(token)
                if child is None:
                    child = children[node][token] = self._new()
                count[child] += delta
                if count[child] <= 0:  # its subtree is this path's rest: freed below it
                    del children[node][token]
                    self.free.append(child)
                node = child

    def _new(self) -> int:
        if self.free:
            node = self.free.pop()
            self.children[node] = {}
            return node
        self.children.append({})
        self.count.append(0)
        return len(self.count) - 1

    def advance(self, nodes: list[int], token: int) -> list[int]:
        """``nodes[j]``: the node of a text's last j + 1 tokens (as far as they occur); the same
        one token later. A suffix that does not occur has no longer extension that does."""
        out: list[int] = []
        children = self.children
        for node in [0, *nodes[: self.depth - 1]]:
            child = children[node].get(token)
            if child is None:
                break
            out.append(child)
        return out

    def walk(self, node: int, max_len: int, min_prob: float) -> tuple[list[int], float]:
        """The most frequent path below ``node`` while its estimated probability stays above
        ``min_prob``; its score is the expected number of accepted tokens."""
        children, count = self.children, self.count
        draft: list[int] = []
        prob, score = 1.0, 0.0
        while len(draft) < max_len and children[node]:
            kids = children[node]
            token, child = max(kids.items(), key=lambda item: count[item[1]])
            prob *= count[child] / sum(count[c] for c in kids.values())
            if prob < min_prob:
                break
            draft.append(token)
            score += prob
            node = child
        return draft, score
