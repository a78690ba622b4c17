"""One tree's engine for ``spec_ab.py``, in a process of its own (its tree's ``python/`` first on
the path): it loads the model once, then answers JSON lines on its standard streams ("ping",
"prompts", "run", "graph", "quit"). It uses only the package's public pieces (the ``LLM``, its
scheduler's ``spec`` and the speculative decoders' factory, under either package name), so it
runs on trees from before the speculative package's rename.

    python benchmark/offline/spec_ab_worker.py --configs JSON [--model M] [--dummy-weights]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time


def _decoder_factory():
    try:
        from minisgl.speculative import create_spec_decoder, parse_speculative_config
    except ImportError:  # a tree from before the package's rename
        from minisgl.spec import create_spec_decoder, parse_speculative_config  # type: ignore
    return create_spec_decoder, parse_speculative_config


def graph_replay_us(engine, replays: int) -> float | None:
    """The device time of one replay of the batch-1 decode graph (µs; the median of three timings
    of ``replays`` back-to-back replays), None without graphs. Replays what the last step left in
    the graph's inputs, so it runs after every timed run: it may write into freed KV slots."""
    import torch

    runner = getattr(engine, "graph_runner", None)
    if runner is None or 1 not in runner.graphs:
        return None
    graph = runner.graphs[1]
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / replays)
    return statistics.median(times)


def spec_counts(stats) -> dict[str, int]:
    """A decoder's counters that its tree has (``ahead_*``: drafting ahead, newer trees)."""
    names = ("verify_steps", "draft_tokens", "accepted_tokens", "ahead_feeds", "ahead_dropped")
    return {k: getattr(stats, k) for k in names if hasattr(stats, k)} if stats else {}


def worker(model: str | None, device: str, configs: dict[str, dict | None], dummy: bool) -> None:
    import torch

    from minisgl import LLM, SamplingParams

    create, parse = _decoder_factory()
    first = next((c for c in configs.values() if c), None)
    llm = LLM(model, device=device, mem_fraction=0.45, speculative_config=first,
              **({"dummy_weights": True} if dummy else {}))
    sched = llm.scheduler
    takes_cache = len(inspect.signature(create).parameters) > 2
    decoders = {m: c and create(parse(c), sched.engine, *([sched.cache] if takes_cache else []))
                for m, c in configs.items()}
    reply = sys.stdout
    sys.stdout = sys.stderr  # the package's own prints stay off the protocol
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            break
        if cmd["cmd"] == "ping":  # started: its engine is built
            out = {}
        elif cmd["cmd"] == "graph":  # after the timed runs: the decode graph's device time
            out = {"us": graph_replay_us(sched.engine, cmd["replays"])}
        elif cmd["cmd"] == "prompts":  # the chat template applied here, once
            out = {name: [llm.apply_chat_template([{"role": "user", "content": text}])
                          for text in texts] for name, texts in cmd["texts"].items()}
        else:  # "run": prefill the prompts (the prefix cache), then time their decode
            spec = sched.spec = decoders[cmd["method"]]
            if spec is not None:  # nothing learned from an earlier run of the same prompts
                spec.reset()
            prompts, batch = cmd["prompts"], cmd["batch"]
            before = spec_counts(spec and spec.stats)
            params = SamplingParams(temperature=0, max_tokens=cmd["max_tokens"])
            secs, outs = 0.0, []
            for i in range(0, len(prompts), batch):
                group = prompts[i : i + batch]
                llm.generate(group, SamplingParams(max_tokens=1), use_tqdm=False)
                start = time.perf_counter()
                outs += [o.token_ids for o in llm.generate(group, params, use_tqdm=False)]
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                secs += time.perf_counter() - start
            stats = spec and spec.stats
            out = {"secs": secs, "tokens": sum(map(len, outs)), "outs": outs,
                   "verify_steps": stats.verify_steps if stats else 0,
                   "spec": {k: v - before.get(k, 0) for k, v in spec_counts(stats).items()}}
        reply.write(json.dumps(out) + "\n")
        reply.flush()
    llm.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--configs", required=True, help="per method its speculative config (JSON)")
    p.add_argument("--dummy-weights", action="store_true")
    args = p.parse_args()
    worker(args.model, args.device, json.loads(args.configs), args.dummy_weights)


if __name__ == "__main__":
    main()
