"""Two trees' speculative decoding, timed run by run in the same minutes: ``bench_spec.py``'s
code and chat workloads, one engine a tree, the trees alternating.

At batch 1 on a small model the host sets a step's time, and the GPU machine's host varies: a
fixed pure-Python loop took 0.20-0.38 s in processes of one 10-minute call, so two trees run one
after the other (each pass minutes long) differ by what the machine did meanwhile. Here each tree
runs in a process of its own (its ``python/`` first on the path), loads the model once and
waits; the driver sends both the same prompts (token ids, from this tree's prompt files: each
tree's ``spec_workloads.py`` would read its own sources) and asks each in turn for one timed run,
alternating which goes first, so a drift in the machine's speed falls on both. A pair's ratio is
``new / old`` of two adjacent runs; the record has each tree's median and the median of the pairs'
ratios. The worker is ``spec_ab_worker.py``.

    python benchmark/offline/spec_ab.py --old-tree DIR --out OUT [--methods none,ngram,suffix]
        [--workloads code,chat] [--batch 1] [--max-tokens 512] [--repeats 7]

``--dummy-weights`` with ``--model`` a directory of the default model's config and tokenizer
(``--save-config DIR`` writes one) needs no weights on the GPU machine: a plain step costs what it
does with the real weights, but the drafts' acceptance is that of random ones. The
``--old-tree`` directory holds the other revision's ``python/`` (``git archive REV python |
tar -x -C DIR``), which may predate the speculative package's rename.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


# ---- the driver ----------------------------------------------------------------------------------

def model_arg(model: str) -> str:
    """A local model directory as an absolute path: each worker runs in its own tree."""
    return os.path.abspath(model) if os.path.exists(model) else model


class Tree:
    """One tree's worker process."""

    def __init__(self, name: str, tree: str, args, configs: dict) -> None:
        self.name = name
        env = dict(os.environ, PYTHONPATH=os.path.join(tree, "python") + os.pathsep
                   + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, os.path.join(HERE, "spec_ab_worker.py"), "--device", args.device,
               "--configs", json.dumps(configs)]
        cmd += (["--model", model_arg(args.model)] if args.model else []) \
            + (["--dummy-weights"] if args.dummy_weights else [])
        self.proc = subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, **cmd) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} tree's worker ended (exit code "
                               f"{self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(cmd="quit")
            except (OSError, RuntimeError):
                pass
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def prompt_texts() -> dict[str, list[str]]:
    """The workloads' prompts as text, from this tree's files (``spec_workloads.py``)."""
    sys.path[:0] = [HERE, os.path.join(ROOT, "python")]  # this tree's package, installed or not
    from spec_workloads import CHATS, code_texts

    return {"code": code_texts(), "chat": list(CHATS)}


def compare(args) -> list[dict]:
    methods = args.methods.split(",")
    configs = {m: None if m == "none" else {"method": m, **json.loads(args.spec_options or "{}")}
               for m in methods}
    # one engine after the other: each sizes its KV pool from the memory it finds free
    trees = {"new": Tree("new", ROOT, args, configs)}
    try:
        texts = {w: t for w, t in prompt_texts().items() if w in args.workloads.split(",")}
        prompts = trees["new"].ask(cmd="prompts", texts=texts)
        trees["old"] = Tree("old", os.path.abspath(args.old_tree), args, configs)
        trees["old"].ask(cmd="ping")
        shapes = [(w, p if args.batch == 1 else (p * -(-args.batch // len(p)))[: args.batch])
                  for w, p in prompts.items()]
        runs: dict[tuple, dict[str, list]] = {}

        def run(tree: str, workload: str, group, method: str, max_tokens: int) -> dict:
            return trees[tree].ask(cmd="run", method=method, prompts=group, batch=args.batch,
                                   max_tokens=max_tokens)

        for workload, group in shapes:  # untimed: every kernel each shape meets
            for method in methods:
                for tree in trees:
                    run(tree, workload, group, method, 16)
        for r in range(args.repeats):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for workload, group in shapes:
                for method in methods[r % len(methods):] + methods[: r % len(methods)]:
                    got = runs.setdefault((workload, method), {"old": [], "new": []})
                    for tree in order:
                        got[tree].append(run(tree, workload, group, method, args.max_tokens))
        graph_us = {t: trees[t].ask(cmd="graph", replays=args.graph_replays)["us"]
                    for t in trees} if args.graph_replays else {}
        records = []
        for (workload, method), got in runs.items():
            tps = {t: [o["tokens"] / o["secs"] for o in got[t]] for t in got}
            pairs = [n / o for n, o in zip(tps["new"], tps["old"])]
            records.append(dict(
                workload=workload, method=method, batch=args.batch,
                old_tokens_per_s=round(median(tps["old"]), 1),
                new_tokens_per_s=round(median(tps["new"]), 1),
                ratio_of_medians=round(median(tps["new"]) / median(tps["old"]), 3),
                median_pair_ratio=round(median(pairs), 3),
                pair_ratios=[round(p, 3) for p in pairs],
                same_tokens=all(n["outs"] == o["outs"] for n, o in zip(got["new"], got["old"])),
                verify_steps={t: got[t][-1]["verify_steps"] for t in got},
                spec={t: got[t][-1].get("spec", {}) for t in got}))  # the last run's
            if method == "none" and args.batch == 1 and all(graph_us.values()):
                # a plain batch-1 step against its decode graph's device time: the rest is the
                # host's share of the step that overlap did not hide
                records[-1].update(
                    {f"{t}_ms_per_token": round(1000 / median(tps[t]), 4) for t in tps},
                    **{f"{t}_graph_replay_ms": round(graph_us[t] / 1000, 4) for t in tps})
            print(json.dumps(records[-1]), flush=True)
        return records
    finally:
        for tree in trees.values():
            tree.close()


def save_config(out: str) -> None:
    """The default model's files but its weights, into ``out``."""
    import shutil

    from minisgl.models.default_model import default_model_path

    source = default_model_path()
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(source):
        if name.endswith(".json"):  # config, generation config, tokenizer and its config
            shutil.copy(os.path.join(source, name), os.path.join(out, name))
    print(f"{source} -> {out} (no weights)")


def command() -> str:
    """This run's command line, without where it wrote."""
    argv = list(sys.argv)
    if "--out" in argv:
        del argv[argv.index("--out") : argv.index("--out") + 2]
    return "python benchmark/offline/spec_ab.py " + " ".join(argv[1:])


def write(records: list[dict], args) -> None:
    sys.path.insert(0, HERE)
    from bench_common import project_commit

    os.makedirs(args.out, exist_ok=True)
    tag = f"spec_ab_batch{args.batch}"
    with open(os.path.join(args.out, f"{tag}.json"), "w") as f:
        json.dump(dict(date=datetime.date.today().isoformat(), commit=project_commit(),
                       command=command(), records=records), f, indent=1)
    lines = [f"`{command()}` at `{project_commit()}`, {datetime.date.today().isoformat()}: each "
             "tree's median output tok/s, and the median of the ratios of adjacent runs "
             "(new / old).", "",
             "| workload | method | batch | old | new | new / old (medians) | "
             "new / old (median pair) | same tokens |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['workload']} | {r['method']} | {r['batch']} | {r['old_tokens_per_s']:,} | "
              f"{r['new_tokens_per_s']:,} | {r['ratio_of_medians']}x | "
              f"{r['median_pair_ratio']}x | {r['same_tokens']} |" for r in records]
    timed = [r for r in records if "new_graph_replay_ms" in r]
    if timed:
        lines += ["", "Plain decoding at batch 1: ms a token against the decode graph's device "
                  "time a replay (back to back, CUDA events).", "",
                  "| workload | old ms/token | old graph ms | new ms/token | new graph ms |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['workload']} | {r['old_ms_per_token']} | {r['old_graph_replay_ms']} | "
                  f"{r['new_ms_per_token']} | {r['new_graph_replay_ms']} |" for r in timed]
    with open(os.path.join(args.out, f"{tag}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old-tree", help="a directory holding the other revision's python/")
    p.add_argument("--model", default=None, help="default: the built-in SmolLM2-135M")
    p.add_argument("--dummy-weights", action="store_true",
                   help="random weights of --model's config (its tokenizer still needed): a plain "
                        "step costs what it does with the real ones, drafts' acceptance does not")
    p.add_argument("--save-config", metavar="DIR",
                   help="only copy the default model's config and tokenizer into DIR (a model "
                        "for --dummy-weights on a machine without its weights) and stop")
    p.add_argument("--device", default="auto")
    p.add_argument("--methods", default="none,ngram,suffix")
    p.add_argument("--workloads", default="code,chat")
    p.add_argument("--spec-options", default=None, help="more of the speculative config (JSON)")
    p.add_argument("--batch", type=int, default=1, help="prompts at a time")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=7, help="timed runs a tree and shape")
    p.add_argument("--graph-replays", type=int, default=300,
                   help="time the batch-1 decode graph's replay on the device (0: no)")
    p.add_argument("--out", default="bench-out")
    args = p.parse_args()
    if args.save_config:
        save_config(args.save_config)
        return
    if not args.old_tree:
        p.error("--old-tree is required")
    write(compare(args), args)


if __name__ == "__main__":
    main()
