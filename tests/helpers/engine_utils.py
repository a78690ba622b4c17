"""Reach into the real engine path for tests: the logits of every position of a batched prefill,
and the greedy tokens of a whole run."""

from __future__ import annotations

import torch

from minisgl.core import Batch, SamplingParams

_PARAMS = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
_FIRST_UID = 1 << 40  # out of the way of the ids the callers use


def prefill_logits(scheduler, prompts: list[list[int]]) -> torch.Tensor:
    """``[sum(len(p)), vocab]``: one batched prefill of ``prompts`` through scheduler, KV cache,
    attention backend and model (all positions, not just the sampled rows). The requests are
    aborted afterwards, so the scheduler is left as it was."""
    uids = [_FIRST_UID + i for i in range(len(prompts))]
    # NOTE: the warm-up (on CUDA) leaves prompts in the radix cache; a prefix hit would leave
    # positions uncomputed and let the cache-aware policy reorder the batch
    scheduler.cache.flush_prefix_cache()
    reqs = [scheduler.add_request(uid, p, _PARAMS) for uid, p in zip(uids, prompts)]
    feeds = scheduler.prefill.schedule(decode_reserve=0)
    scheduler.cache.flush()
    assert [f.req for f in feeds] == reqs, "the prompts must fit in one prefill"
    batch = Batch(feeds, "prefill")
    engine = scheduler.engine
    engine.prepare(batch)  # a hybrid model's state metadata too; on CUDA padding tokens last
    with torch.inference_mode(), engine.ctx.forward_batch(batch):
        engine.attn_backend.prepare_metadata(batch)
        hidden = engine.model(batch.input_ids, batch.positions, engine.ctx)
        logits = engine.model.compute_logits(hidden[: sum(map(len, prompts))])
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
        for feed, row in zip(batch.sampled, out.logits):
            recorded.setdefault(feed.uid, []).append(row.clone())
        return out

    engine.forward = spy
    return recorded


def conversation_with_radix_hits(path, make_llm, page_size: int) -> None:
    """Three turns of a conversation, each prompt the previous one with its answer and a new
    message, through the sliding layers' own pool and the radix cache: each turn resumes where
    the previous one's cached KV ends (``kvcache/window_radix.py``) and gives transformers'
    tokens; then the cache is flushed, both pools are whole again, and the LLM is closed."""
    from helpers.hf_models import hf_greedy, random_prompts

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm = make_llm(path, page_size=page_size, sliding_pool_ratio=0.1, cache="radix")
    cache = llm.scheduler.cache
    assert cache.window.tree is not None
    messages = random_prompts(3, [23, 9, 14], 256, seed=3)
    prompt: list[int] = []
    for message in messages:
        prompt = prompt + message
        expected = hf_greedy(path, [prompt], 16)[0]
        before = cache.num_hit_tokens
        out = llm.generate([prompt], params)[0].token_ids
        assert out == expected
        if len(prompt) > len(messages[0]):  # resumes at the last turn's cached end
            previous_end = len(prompt) - len(message) - 1  # its last token was not fed
            assert cache.num_hit_tokens - before == previous_end // page_size * page_size
        llm.scheduler.check_integrity()
        prompt = prompt + out
    cache.flush_prefix_cache()
    assert cache.window.free_tokens == cache.window.num_tokens
    llm.scheduler.check_integrity()
    llm.close()
