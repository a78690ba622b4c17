"""Reach into the real engine path for tests: the logits of every position of a batched prefill,
and the greedy tokens of a whole run."""

from __future__ import annotations

import torch

from minisgl.core import SamplingParams

_PARAMS = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
_FIRST_UID = 1 << 40  # out of the way of the ids the callers use


def prefill_logits(scheduler, prompts: list[list[int]]) -> torch.Tensor:
    """``[sum(len(p)), vocab]``: one batched prefill of ``prompts`` through scheduler, KV cache,
    attention backend and model (all positions, not just the sampled rows). The requests are
    aborted afterwards, so the scheduler is left as it was."""
    uids = [_FIRST_UID + i for i in range(len(prompts))]
    reqs = [scheduler.add_request(uid, p, _PARAMS) for uid, p in zip(uids, prompts)]
    batch = scheduler.prefill.schedule(decode_reserve=0)
    scheduler.cache.flush()
    assert batch is not None and batch.reqs == reqs, "the prompts must fit in one prefill"
    engine = scheduler.engine
    engine.prepare(batch)  # on CPU no padding; a hybrid model's state metadata too
    with torch.inference_mode(), engine.ctx.forward_batch(batch):
        engine.attn_backend.prepare_metadata(batch)
        hidden = engine.model(batch.input_ids, batch.positions, engine.ctx)
        logits = engine.model.compute_logits(hidden)
    for uid in uids:
        scheduler.abort(uid)
    return logits


def logits_and_tokens(scheduler, prompts: list[list[int]],
                      params: SamplingParams) -> tuple[torch.Tensor, list[list[int]]]:
    """``prefill_logits`` of ``prompts``, then every token of running them with ``params`` to the
    end; checks the scheduler's integrity and closes it."""
    logits = prefill_logits(scheduler, prompts)
    tokens: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        scheduler.add_request(i, p, params)
    while scheduler.has_work:
        for out in scheduler.step():
            tokens.setdefault(out.uid, []).append(out.token)
    scheduler.check_integrity()
    scheduler.close()
    return logits, [tokens[i] for i in range(len(prompts))]


def record_sampled_logits(engine) -> dict[int, list[torch.Tensor]]:
    """From now on, every forward's logits of each sampled request, by request uid (a row per
    step): wraps ``engine.forward``."""
    recorded: dict[int, list[torch.Tensor]] = {}
    forward = engine.forward

    def spy(batch, args):
        out = forward(batch, args)
        for req, row in zip(batch.sampled_reqs, out.logits):
            recorded.setdefault(req.uid, []).append(row.clone())
        return out

    engine.forward = spy
    return recorded
