"""Which requests the next forward runs: decode rows, verifying requests' drafts, prefill chunks.

``mixed`` (the default): every running request's decode token (with its drafts when this step
speculates), then prefill chunks under the step's token budget. ``prefill-first`` (an ablation):
a prefill batch whenever one can be made, else the decode batch.
"""

from __future__ import annotations

from typing import Callable

from minisgl.core import Batch

from .config import SchedulerConfig
from .decode import DecodeManager
from .prefill import PrefillManager


class BatchPlanner:
    def __init__(self, config: SchedulerConfig, prefill: PrefillManager, decode: DecodeManager,
                 retractions: Callable[[], int]) -> None:
        self.config, self.prefill, self.decode = config, prefill, decode
        self.retractions = retractions  # how many retractions so far (the scheduler counts)

    def schedule(self, spec=None, ahead: frozenset[int] = frozenset()) -> Batch | None:
        """The next batch; ``spec``: the ``SpecDecoder`` when this step speculates; ``ahead``:
        requests whose verify step is still in flight (``SpecDecoder.add_drafts``)."""
        if ahead:  # no prefill joins: the step must run as decode rows (``spec/rows.py``), whose
            # first row of a request reads the bonus token from the token pool
            return self._with_drafts(self.decode.schedule(), self.config.max_num_batched_tokens,
                                     spec, ahead)
        if self.config.mixed:
            return self._mixed(spec)
        batch = self.prefill.schedule(decode_reserve=self.decode.tokens_needed())
        if batch is not None:
            return batch
        return self._with_drafts(self.decode.schedule(), self.config.max_prefill_tokens, spec)

    def _with_drafts(self, decode: Batch | None, budget: int, spec,
                     ahead: frozenset[int] = frozenset()) -> Batch | None:
        """Speculating: decode requests with drafts move to the prefill part of the batch (they
        feed k + 1 tokens); the others stay one-token decode rows."""
        if decode is None:
            return None
        for req in decode.reqs:  # what an earlier launch still in flight drafts is its Segment's
            req.draft_len = 0
        if spec is None:
            return decode
        verify = spec.add_drafts(decode.reqs, budget - decode.size, ahead)
        if not verify:
            return decode
        plain = [req for req in decode.reqs if not req.draft_len]
        if not plain:
            return Batch(verify, "prefill")
        return Batch(plain + verify, "mixed", num_decode=len(plain))

    def _mixed(self, spec) -> Batch | None:
        """Decode every running request, then fill the step's token budget with prefill chunks.

        A step that had to retract admits nothing: memory is short, and the freed room would go to
        re-admitting what was just retracted.
        """
        retractions = self.retractions()
        decode = self._with_drafts(self.decode.schedule(), self.config.max_num_batched_tokens,
                                   spec)
        if self.retractions() > retractions:
            return decode
        num_decode = decode.num_tokens if decode is not None else 0
        prefill = self.prefill.schedule(decode_reserve=self.decode.tokens_needed(),
                                        budget=self.config.max_num_batched_tokens - num_decode)
        if prefill is None or decode is None:
            return prefill or decode
        if decode.num_decode_rows == 0:  # only verifying requests: they extend like prefills
            return Batch(decode.reqs + prefill.reqs, "prefill")
        return Batch(decode.reqs + prefill.reqs, "mixed", num_decode=decode.num_decode_rows)
