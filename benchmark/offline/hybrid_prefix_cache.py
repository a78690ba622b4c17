"""Prefix caching of a hybrid (Gated DeltaNet) model: hit rate and the memory of the state
snapshots, on a workload of requests that share a system prompt and some that repeat a whole
earlier prompt (multi-turn)::

    python benchmark/offline/hybrid_prefix_cache.py --model benchmark/configs/qwen3.5-9b.json

Each request is ``system prompt + its own question``; every third one repeats an earlier question
(a follow-up turn). With page size 1 every prompt's end is a resume point (a snapshot); with larger
pages only prompts that end on a page boundary are. The prompts arrive in waves of ``--wave``, so
a wave can reuse what the earlier ones cached.
"""

from __future__ import annotations

import argparse
import random

from bench_common import model_dir

from minisgl import LLM, SamplingParams


def workload(n: int, system_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randint(10, 9000) for _ in range(system_len)]
    prompts: list[list[int]] = []
    for i in range(n):
        if i % 3 == 2:  # a follow-up: an earlier conversation plus a new turn
            prompts.append(prompts[rng.randrange(len(prompts))]
                           + [rng.randint(10, 9000) for _ in range(rng.randint(8, 64))])
        else:
            prompts.append(system + [rng.randint(10, 9000) for _ in range(rng.randint(16, 256))])
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="HF directory, or a config.json (dummy)")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--system-len", type=int, default=512)
    parser.add_argument("--wave", type=int, default=8)
    parser.add_argument("--page-size", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--snapshots", type=int, default=None, help="--num-state-snapshots")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    path, dummy = model_dir(args.model)
    prompts = workload(args.requests, args.system_len)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    total = sum(len(p) for p in prompts)
    for page in args.page_size:
        llm = LLM(path, dummy_weights=dummy, device=args.device, page_size=page,
                  num_state_snapshots=args.snapshots)
        for i in range(0, len(prompts), args.wave):
            llm.generate(prompts[i:i + args.wave], params)
        sched = llm.scheduler
        pool, cache = sched.engine.state_pool, sched.cache
        held = pool.num_snapshots - pool.num_free_snapshots
        print(f"page {page}: hit {cache.num_hit_tokens}/{total} prompt tokens "
              f"({cache.num_hit_tokens / total:.1%}); snapshots taken "
              f"{cache.prefix_cache.num_snapshots_taken}, held {held}/{pool.num_snapshots} "
              f"({held * pool.bytes_per_slot / 2**20:.1f} MiB of "
              f"{pool.num_snapshots * pool.bytes_per_slot / 2**20:.1f} MiB reserved); "
              f"one slot {pool.bytes_per_slot / 2**20:.2f} MiB = "
              f"{pool.bytes_per_slot / sched.engine.kv_bytes_per_token:.0f} tokens of KV",
              flush=True)


if __name__ == "__main__":
    main()
