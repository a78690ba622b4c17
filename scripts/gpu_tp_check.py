"""On a machine with two GPUs: tensor parallelism on CUDA, one engine feature at a time.

    python scripts/gpu_tp_check.py --out tp_check        # tiny random Qwen3, float32

Runs the offline ``LLM`` at TP=1 (the reference), then at TP=2 with CUDA graphs and overlap
scheduling switched on one by one, each in its own process under a time limit. A run past its
limit gets SIGUSR1 in every process of its tree (each prints its Python stacks to stderr, kept in
``OUT/<variant>.log``), then is killed. Prints one line per variant: ok / hang / error, seconds, and
whether its greedy tokens equal TP=1's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

VARIANTS = {
    "tp1": (1, {}),
    "eager-sync": (2, {"cuda_graph_max_bs": 0, "disable_overlap": True}),
    "eager-overlap": (2, {"cuda_graph_max_bs": 0}),
    "graph-sync": (2, {"disable_overlap": True}),
    "graph-overlap": (2, {}),
}


def run_variant(model: str, name: str, out: str) -> None:
    """The child: generate greedily and write the tokens."""
    from minisgl import LLM, SamplingParams
    from minisgl.utils.stacks import enable_stack_dumps

    enable_stack_dumps()
    tp, options = VARIANTS[name]
    llm = LLM(model, tp=tp, device="cuda", dtype="float32", num_pages=4096, **options)
    prompts = [[(7 * i + 3 * j) % 200 + 1 for j in range(n)] for i, n in enumerate([5, 17, 40, 90])]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    tokens = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    with open(out, "w") as f:
        json.dump(tokens, f)
    llm.close()


def _tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_all(procs: list, sig: int) -> None:
    import psutil

    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass  # already gone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="tp_check")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--tokens", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return run_variant(args.model, args.run, args.tokens)

    from helpers.hf_models import make_tiny_checkpoint

    os.makedirs(args.out, exist_ok=True)
    model = str(make_tiny_checkpoint("qwen3", os.path.join(tempfile.mkdtemp(), "qwen3")))
    env = dict(os.environ, NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "WARN"))
    reference = None
    for name in VARIANTS:
        tokens_file = os.path.join(args.out, f"{name}.json")
        with open(os.path.join(args.out, f"{name}.log"), "w") as log:
            start = time.monotonic()
            proc = subprocess.Popen([sys.executable, __file__, "--run", name, "--model", model,
                                     "--tokens", tokens_file], stdout=log, stderr=log, env=env)
            try:
                code = proc.wait(args.timeout)
                status = "ok" if code == 0 else f"error (exit {code})"
            except subprocess.TimeoutExpired:
                tree = _tree(proc.pid)
                # stacks to the log (helpers without a handler exit)
                _signal_all(tree, signal.SIGUSR1)
                time.sleep(3)
                _signal_all(tree, signal.SIGKILL)
                proc.wait()
                status = "hang"
            seconds = time.monotonic() - start
        tokens = json.load(open(tokens_file)) if status == "ok" else None
        if name == "tp1":
            reference = tokens
        same = ("" if tokens is None
                else "tokens == tp1" if tokens == reference else "TOKENS DIFFER")
        print(f"{name:14s} {status:16s} {seconds:6.1f} s  {same}", flush=True)


if __name__ == "__main__":
    main()
