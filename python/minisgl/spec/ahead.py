"""Overlap scheduling with speculation: whether the next forward may be drafted and launched
before the verify step in flight is read back (``decoder.py`` says how its drafts are made and
judged), and what each launched forward feeds per request (``Segment``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)
class Segment:
    """What one launched forward feeds for one request, taken at launch (a later launch changes
    the request's counters before this one is read back): ``k`` drafts from ``input_ids[base]``
    on. ``guess``: (index, token), the token this step assumed at ``input_ids[index]``, the bonus
    token of the verify step before it, still in flight when this one was drafted; ``dropped``:
    that step rejected a draft, so this one computed positions that do not exist."""

    k: int
    base: int
    guess: tuple[int, int] | None = None
    dropped: bool = False


def read_ahead(sched, prev, drafting: bool) -> frozenset[int] | None:
    """For ``sched`` (a ``Scheduler`` about to plan a step that drafts if ``drafting``) and
    ``prev`` (the forward in flight: its sampled requests, output and ``Segment``s, or None): the
    requests the next step may draft for on the optimistic context (``SpecDecoder.add_drafts``'s
    ``ahead``), or None if ``prev`` must be read back first.

    A request that verified drafts in ``prev`` can draft again on the assumption that all of them
    are accepted (the verdict drops this forward's part otherwise), if its drafts are usually all
    accepted (``SpecDecoder.drafts_ahead``: a dropped step costs a forward). One whose part of
    ``prev`` was already dropped is exactly known to the host (the verdict before cut it back), so
    it drafts as usual while that useless forward finishes. One that decoded a plain row in
    ``prev`` cannot draft: its drafts would follow a token the host does not know, so a step that
    drafts reads such a ``prev`` first, as does a step that might have to retract a request (room
    for every running request's drafts is asked) or that would not run as decode rows."""
    segs = prev[2] if prev is not None else None
    if segs is None or not sched.config.overlap:
        return None
    spec = sched.spec
    verifying = [req for req, seg in zip(prev[0], segs) if seg.k and not seg.dropped]
    if not verifying and not drafting:
        return frozenset()
    if drafting and (any(not seg.k and not seg.dropped for seg in segs)
                     or verifying and not spec.drafts_ahead(verifying)):
        return None
    page, k = sched.cache.page_size, spec.config.num_speculative_tokens
    running = len(sched.decode.running)
    if (running * (k + 2 + page) > sched.cache.available_tokens
            or not sched.engine.verifies_as_rows(running * (k + 1))):
        return None
    return frozenset(req.uid for req in verifying)
