"""Write the small synthetic trace ``sample_trace.jsonl`` (seeded, so it is reproducible).

It has the fields of the Qwen usage trace (``chat_id``, ``parent_chat_id``, ``timestamp`` in
seconds, ``input_length``, ``output_length``, ``type``, ``turn``, ``hash_ids`` of 16-token blocks)
and its shape in miniature: bursty arrivals (the rate switches between calm and busy every 10 s),
a few system prompts shared by many conversations, and follow-up turns whose prompt extends their
parent's (same leading blocks), so a prefix cache has something to find. Lengths are small enough
for a CPU run.

    python benchmark/online/make_sample_trace.py [--out PATH] [--requests N] [--seed S]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random

BLOCK = 16
RATES = (1.0, 4.0)  # requests per second in calm / busy 10-second windows
SYSTEM_PROMPTS = 3
SYSTEM_BLOCKS = 4


def make_trace(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    fresh = itertools.count(SYSTEM_PROMPTS * SYSTEM_BLOCKS)
    ids = list(range(SYSTEM_PROMPTS * SYSTEM_BLOCKS))
    systems = [ids[i * SYSTEM_BLOCKS:(i + 1) * SYSTEM_BLOCKS] for i in range(SYSTEM_PROMPTS)]
    t, records = 0.0, []
    for chat_id in range(n):
        t += rng.expovariate(RATES[int(t // 10) % 2])
        parent = rng.choice(records) if records and rng.random() < 0.35 else None
        if parent is None:
            prefix = rng.choice(systems) if rng.random() < 0.7 else []
            input_len = len(prefix) * BLOCK + rng.randint(16, 192)
            turn, parent_id = 1, -1
        else:  # the parent's prompt and answer, then a new message
            prefix = parent["hash_ids"][: parent["input_length"] // BLOCK]
            input_len = parent["input_length"] + parent["output_length"] + rng.randint(8, 48)
            turn, parent_id = parent["turn"] + 1, parent["chat_id"]
        blocks = -(-input_len // BLOCK)
        hash_ids = prefix[:blocks] + [next(fresh) for _ in range(blocks - len(prefix[:blocks]))]
        records.append({"chat_id": chat_id, "parent_chat_id": parent_id, "timestamp": round(t, 3),
                        "input_length": input_len, "output_length": rng.randint(4, 48),
                        "type": "text", "turn": turn, "hash_ids": hash_ids})
    return records


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(here, "sample_trace.jsonl"))
    parser.add_argument("--requests", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with open(args.out, "w") as f:
        for record in make_trace(args.requests, args.seed):
            f.write(json.dumps(record) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
