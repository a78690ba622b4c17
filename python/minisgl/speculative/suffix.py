"""Suffix decoding (Arctic Inference's method): frequency-weighted continuations from suffix tries
over the request's own tokens and over recent requests' outputs.

Each trie holds every suffix of its text cut to ``max_tree_depth`` tokens, with a count per node:
how many times that token sequence occurred. A request's last tokens locate the deepest node that
matches them (a longer match predicts better), and a shallower one that leaves room below it for a
whole draft (a trie cut at D tokens holds only D - n tokens after an n-token match; Arctic
Inference also weighs several match lengths); from each, the draft follows the most frequent
child while the product of the children's shares (an estimate of the chance that the whole draft
so far is right) stays above ``min_token_prob``, and for at most ``max_spec_factor`` tokens per
matched token; the draft with the larger sum of those estimates wins. Agent loops repeat
themselves across turns (tool calls, file contents), which the global trie catches; a request's
own trie catches copying from its prompt.

The request's own text is not built into a trie: that costs O(n D) dictionary operations for an
n-token prompt, as long as hundreds of decode steps of a small model on a GPU. Its occurrences of
the last tokens are found with vectorised compares over a numpy copy of the text (``ngram.py``'s
history), and the continuations of those occurrences, counted, are the trie's children: the same
drafts, at O(n) per step. The global trie (``suffix_trie.py``, which learns finished outputs in the
host's spare time) is matched incrementally: per request the nodes of its last 1..D tokens are kept
(they depend on those tokens alone, so a long new stretch is matched from its last D), and one
appended token advances them in O(D).
"""

from __future__ import annotations

import numpy as np

from minisgl.core import Req

from .ngram import TokenHistory
from .proposer import Proposer
from .suffix_trie import SuffixTrie


def _own_match(tokens: np.ndarray, depth: int) -> list[np.ndarray]:
    """``levels[n - 1]``: the earlier occurrences (end positions) of the last n tokens, for every n
    up to the longest suffix of ``tokens`` that occurred before (at most ``depth - 1`` long, as a
    trie cut at ``depth`` has children there); empty if the last token is new."""
    total = len(tokens)
    ends = np.flatnonzero(tokens[: total - 1] == tokens[-1])
    levels = [ends] if len(ends) else []
    while levels and len(levels) < min(depth - 1, total - 1):
        n = len(levels)
        longer = ends[ends >= n]
        longer = longer[tokens[longer - n] == tokens[total - 1 - n]]
        if not len(longer):
            break
        ends = longer
        levels.append(ends)
    return levels


def _own_walk(tokens: np.ndarray, ends: np.ndarray, max_len: int,
              min_prob: float) -> tuple[list[int], float]:
    """``SuffixTrie.walk`` over the continuations of the occurrences ``ends``: at each step the most
    frequent next token (ties: the one that occurred first, as a trie's first-made child)."""
    draft: list[int] = []
    prob, score = 1.0, 0.0
    while len(draft) < max_len:
        ends = ends[ends + 1 + len(draft) < len(tokens)]  # those whose text goes on
        if not len(ends):
            break
        following = tokens[ends + 1 + len(draft)]
        values, first, counts = np.unique(following, return_index=True, return_counts=True)
        best = np.lexsort((first, -counts))[0]
        prob *= float(counts[best]) / len(following)
        if prob < min_prob:
            break
        draft.append(int(values[best]))
        score += prob
        ends = ends[following == values[best]]
    return draft, score


class _State:
    """One request: its text (numpy) and its matched nodes in the global trie."""

    def __init__(self) -> None:
        self.history = TokenHistory()
        self.shared: list[int] = []  # shared[j]: the node of the last j + 1 tokens, if any
        self.removals = 0  # the trie's ``removals`` when they were matched
        self.seen = 0
        # the last ``propose_ahead``'s tail and its nodes: a sync that finds those tokens accepted
        # takes the nodes instead of advancing over them again
        self.ahead: tuple[list[int], list[int]] | None = None


class SuffixProposer(Proposer):
    name = "suffix"
    lookahead = True

    def __init__(self, depth: int, max_cached_requests: int, max_spec_factor: float,
                 min_token_prob: float) -> None:
        self.depth, self.factor, self.min_prob = depth, max_spec_factor, min_token_prob
        self.shared = SuffixTrie(depth, max_cached_requests)
        self.states: dict[int, _State] = {}

    def _sync(self, req: Req) -> _State:
        state = self.states.get(req.uid)
        if state is None:
            state = self.states[req.uid] = _State()
        ids = req.input_ids
        start = state.seen
        if state.removals != self.shared.removals:  # its nodes' ids may be reused
            start, state.shared, state.removals = 0, [], self.shared.removals
        if len(ids) - start >= self.depth:  # the nodes depend on the last D tokens only
            start, state.shared = len(ids) - self.depth, []
        elif state.ahead is not None and start == state.seen:
            tail, nodes = state.ahead
            if ids[start : start + len(tail)] == tail:
                start, state.shared = start + len(tail), nodes
        state.ahead = None
        for token in ids[start:]:
            state.shared = self.shared.advance(state.shared, token)
        state.seen = len(ids)
        return state

    def propose(self, req: Req, max_len: int) -> list[int]:
        """The best-scored draft from two matches in each trie: the longest one, and the longest
        that leaves room below it in the depth-cut trie for ``max_len`` tokens (a long match
        predicts better, but a trie cut at D tokens holds only D - n of what followed an n-token
        match)."""
        state = self._sync(req)
        return self._draft(state.history.sync(req.input_ids), state.shared, max_len)

    def propose_ahead(self, req: Req, tail: list[int], max_len: int) -> list[int]:
        state = self._sync(req)
        nodes = state.shared
        for token in tail:
            nodes = self.shared.advance(nodes, token)
        state.ahead = (list(tail), nodes)
        return self._draft(state.history.sync(req.input_ids, tail), nodes, max_len)

    def _draft(self, tokens: np.ndarray, nodes: list[int], max_len: int) -> list[int]:
        """``propose`` for a text and its nodes in the global trie (``nodes[j]``: the node of its
        last j + 1 tokens)."""
        candidates = []
        levels = _own_match(tokens, self.depth) if len(tokens) > 1 else []
        for n in self._match_lengths(len(levels), max_len):
            candidates.append(_own_walk(tokens, levels[n - 1], self._limit(n, max_len),
                                        self.min_prob))
        children = self.shared.children  # the deepest node with a continuation
        deepest = next((j + 1 for j in range(len(nodes) - 1, -1, -1) if children[nodes[j]]), 0)
        for n in self._match_lengths(deepest, max_len):
            candidates.append(self.shared.walk(nodes[n - 1], self._limit(n, max_len),
                                               self.min_prob))
        return max(candidates, key=lambda found: found[1], default=([], 0.0))[0]

    def _match_lengths(self, longest: int, max_len: int) -> set[int]:
        """The match lengths to draft from, given the longest (0: none)."""
        if not longest:
            return set()
        return {longest, max(1, min(longest, self.depth - max_len))}

    def _limit(self, matched: int, max_len: int) -> int:
        """Draft length allowed after a ``matched``-token match: ``max_spec_factor`` per token, and
        within the trie's depth."""
        return min(max_len, max(1, int(self.factor * matched)), self.depth - matched)

    def finished(self, req: Req, learn: bool = True) -> None:
        self.states.pop(req.uid, None)
        if learn:  # learned in the host's spare time (``spare``)
            self.shared.add(req.input_ids[req.prompt_len :])

    def spare(self, budget: int | None) -> bool:
        return self.shared.learn(budget)
