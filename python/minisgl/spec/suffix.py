"""Suffix decoding (Arctic Inference's method): frequency-weighted continuations from suffix tries
over the request's own tokens and over recent requests' outputs.

Each trie holds every suffix of its text cut to ``max_tree_depth`` tokens, with a count per node:
how many times that token sequence occurred. A request's last tokens locate the deepest node that
matches them (a longer match predicts better); from there the draft follows the most frequent
child while the product of the children's shares (an estimate of the chance that the whole draft
so far is right) stays above ``min_token_prob``, and for at most ``max_spec_factor`` tokens per
matched token. Agent loops repeat themselves across turns (tool calls, file contents), which the
global trie catches; a request's own trie catches copying from its prompt.

Both tries are matched incrementally: per request the nodes of its last 1..D tokens are kept, and
one appended token advances them in O(D), so a step never searches from the root.
"""

from __future__ import annotations

from collections import deque

from minisgl.core import Req

from .proposer import Proposer


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


def _advance(root: _Node, nodes: list[_Node], token: int, depth: int, grow: bool) -> list[_Node]:
    """The nodes of the suffixes one token longer. ``grow``: add the token (the request's own
    trie); otherwise follow existing edges only, stopping at the first missing one (a missing
    suffix has no longer extension in a trie of all suffixes)."""
    out: list[_Node] = []
    for node in [root, *nodes[: depth - 1]]:
        child = node.children.get(token)
        if child is None:
            if not grow:
                break
            child = node.children[token] = _Node()
        if grow:
            child.count += 1
        out.append(child)
    return out


def _walk(node: _Node, max_len: int, min_prob: float) -> tuple[list[int], float]:
    """The most frequent path below ``node`` while its estimated probability stays above
    ``min_prob``; its score is the expected number of accepted tokens."""
    draft: list[int] = []
    prob, score = 1.0, 0.0
    while len(draft) < max_len and node.children:
        total = sum(child.count for child in node.children.values())
        token, child = max(node.children.items(), key=lambda item: item[1].count)
        prob *= child.count / total
        if prob < min_prob:
            break
        draft.append(token)
        score += prob
        node = child
    return draft, score


class _GlobalTrie:
    """Suffixes of the last ``capacity`` finished requests' outputs; the oldest is removed (its
    counts taken back) when a new one comes."""

    def __init__(self, depth: int, capacity: int) -> None:
        self.root, self.depth, self.capacity = _Node(), depth, capacity
        self.texts: deque[list[int]] = deque()

    def add(self, tokens: list[int]) -> None:
        if not tokens:
            return
        self.texts.append(tokens)
        self._update(tokens, +1)
        while len(self.texts) > self.capacity:
            self._update(self.texts.popleft(), -1)

    def _update(self, tokens: list[int], delta: int) -> None:
        for start in range(len(tokens)):
            node = self.root
            for token in tokens[start : start + self.depth]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += delta
                if child.count <= 0:
                    del node.children[token]
                    break
                node = child


class _State:
    """One request: its own trie and the matched nodes in both tries."""

    def __init__(self) -> None:
        self.root = _Node()
        self.own: list[_Node] = []  # own[j]: the node of the last j + 1 tokens
        self.shared: list[_Node] = []  # the same in the global trie, as deep as it matches
        self.seen = 0


class SuffixProposer(Proposer):
    name = "suffix"

    def __init__(self, depth: int, max_cached_requests: int, max_spec_factor: float,
                 min_token_prob: float) -> None:
        self.depth, self.factor, self.min_prob = depth, max_spec_factor, min_token_prob
        self.shared = _GlobalTrie(depth, max_cached_requests)
        self.states: dict[int, _State] = {}

    def _sync(self, req: Req) -> _State:
        state = self.states.get(req.uid)
        if state is None:
            state = self.states[req.uid] = _State()
        for token in req.input_ids[state.seen :]:
            state.own = _advance(state.root, state.own, token, self.depth, grow=True)
            state.shared = _advance(self.shared.root, state.shared, token, self.depth, grow=False)
        state.seen = len(req.input_ids)
        return state

    def propose(self, req: Req, max_len: int) -> list[int]:
        state = self._sync(req)
        best: tuple[list[int], float] = ([], 0.0)
        for nodes in (state.own, state.shared):
            # the deepest match that has a continuation; its depth bounds the draft
            for j in range(len(nodes) - 1, -1, -1):
                if nodes[j].children:
                    limit = min(max_len, max(1, int(self.factor * (j + 1))))
                    found = _walk(nodes[j], limit, self.min_prob)
                    if found[1] > best[1]:
                        best = found
                    break
        return best[0]

    def finished(self, req: Req) -> None:
        self.states.pop(req.uid, None)
        self.shared.add(req.input_ids[req.prompt_len :])
