"""Speculative decoding: acceptance and batch-1 decode tokens/s with and without it, and the cost
of a verify step.

``--workloads code,chat``: code editing (a source file of this repository plus an instruction to
change a little of it: the answer mostly copies the file) and chat (open questions: little to
copy). Each prompt runs alone (batch 1), greedy, with each method in ``--methods`` (``none`` is
the baseline; ``spec_workloads.py`` runs them on one engine, interleaved, ``--repeats`` times),
after its prompt was prefilled into the prefix cache (the timed run decodes); the record has the
median run's decode tokens/s, the mean accepted length and acceptance rate, and whether the
tokens equal the baseline's. ``--batch N`` also runs all prompts of a workload together, N at a
time (speculation backs off above ``disable_by_batch_size``). Every shape first runs untimed
(kernels compile there), and every run's proposer starts empty (the suffix method's global trie
has not seen the same prompts' answers in an earlier run).

``--verify-cost``: on ``--model`` (a config.json gets random weights), the time of a step in which
every request verifies k drafts (a proposer that always drafts k tokens), k = 1..8, against a
plain decode step, at batch 1 and ``--batch``.

``--eagle3-cost``: on ``--model`` given as a config.json, with a random EAGLE-3 draft shaped
after it (its attention and MLP sizes, a 32k draft vocabulary, the default aux layers), the time
of a batch-1 step that drafts k tokens with the draft and verifies them, k = 1..8, against a step
of the same engine with speculation off (under the decode CUDA graphs on a GPU, as the head's
steps are), and the time of a step's one ``propose_many`` (the draft's catch-up and its k chained
steps). A random draft is never accepted: each step yields one token. ``--mtp-cost``: the same
with the target's own multi-token-prediction head (a config with ``mtp_num_hidden_layers``, e.g.
Qwen3.5); it also runs on a tree from before the speculative package's rename (the head drafted
eagerly there, one ``propose`` a request, with the decode graphs off).

    python benchmark/offline/bench_spec.py --out benchmark/results/cpu
    python benchmark/offline/bench_spec.py --model benchmark/configs/qwen3-8b.json --verify-cost
    python benchmark/offline/bench_spec.py --model benchmark/configs/qwen3-8b.json --eagle3-cost
    python benchmark/offline/bench_spec.py --model benchmark/configs/qwen3.5-9b.json --mtp-cost
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import time

import torch
from bench_common import gpu_name, model_dir, project_commit
from spec_workloads import bench_workloads, run_workload

from minisgl import LLM, SamplingParams

try:
    from minisgl.speculative.proposer import Proposer
except ImportError:  # a tree from before the package's rename (``--mtp-cost`` against it)
    from minisgl.spec.proposer import Proposer  # type: ignore


class FixedDrafts(Proposer):
    """Always ``k`` drafts (the last token repeated): the cost of verifying k tokens, whatever
    the acceptance."""

    name = "fixed"

    def __init__(self, k: int) -> None:
        self.k = k

    def propose(self, req, max_len: int) -> list[int]:
        return [req.input_ids[-1]] * min(self.k, max_len)


def bench_verify_cost(args, base: dict) -> list[dict]:
    """One engine for every batch size; a step with speculation off (overlap on: the real
    baseline), then steps in which every request verifies k drafts (rejected or not, the cost is
    the same)."""
    path, dummy = model_dir(args.model)
    records = []
    params = SamplingParams(temperature=0, max_tokens=args.cost_steps, ignore_eos=True)
    config = {"method": "ngram", "num_speculative_tokens": 8, "adaptive": False,
              "disable_by_batch_size": 4096, "hybrid_verify_requests": args.batch}
    llm = LLM(path, device=args.device, dummy_weights=dummy, warmup="off",
              max_running_requests=max(args.batch, 8), speculative_config=config)
    sched = llm.scheduler
    spec = sched.spec
    for batch in sorted({1, args.batch}):
        prompts = [[(7 * i + j) % 1000 + 10 for j in range(64)] for i in range(batch)]
        for k in [0, *range(1, 9)]:
            sched.spec = spec if k else None
            spec.proposer = FixedDrafts(k)
            llm.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
            for uid, p in enumerate(prompts):
                sched.add_request(10**6 * (k + 1) + uid, p, params)
            sched.step()  # the prefill (a prefix-cache hit)
            steps, start = 0, time.perf_counter()
            while sched.has_work:
                sched.step()
                steps += 1
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            ms = (time.perf_counter() - start) * 1000 / steps
            rec = dict(base, kind="verify_cost", batch=batch, k=k, ms_per_step=round(ms, 3),
                       tokens_per_step=batch * (k + 1))
            records.append(rec)
            print(json.dumps(rec), flush=True)
    llm.close()
    for rec in records:
        plain = next(r for r in records if r["batch"] == rec["batch"] and r["k"] == 0)
        rec["cost_vs_decode"] = round(rec["ms_per_step"] / plain["ms_per_step"], 3)
    return records


def eagle3_draft_config(target: str, out: str) -> str:
    """A config-only EAGLE-3 draft for the target config.json ``target`` (random weights)."""
    with open(target) as f:
        cfg = json.load(f)
    cfg = cfg.get("text_config") or cfg
    draft = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
             "draft_vocab_size": 32000, "eagle_config": {}, "tie_word_embeddings": False,
             **{key: cfg[key] for key in ("hidden_size", "num_attention_heads",
                                          "num_key_value_heads", "intermediate_size",
                                          "vocab_size", "rms_norm_eps", "max_position_embeddings")
                if key in cfg},
             "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
             "rope_theta": cfg.get("rope_theta", 10000.0)}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(draft, f)
    return out


def bench_head_cost(args, base: dict, method: str) -> list[dict]:
    """One engine drafting with a head (``eagle3``: a random draft shaped after the target;
    ``mtp``: the target's own MTP head); batch 1; k = 0 (speculation off), 1..8."""
    path, dummy = model_dir(args.model)
    assert dummy, f"--{method}-cost takes a config.json (random target and draft weights)"
    config = {"method": method, "num_speculative_tokens": 8, "adaptive": False}
    if method == "eagle3":
        config["model"] = eagle3_draft_config(args.model, os.path.join(path, "eagle3-draft"))
    llm = LLM(path, device=args.device, dummy_weights=True, warmup="off",
              speculative_config=config)
    sched, records = llm.scheduler, []
    spec, prompt = sched.spec, [[(7 * j) % 1000 + 10 for j in range(512)]]
    params = SamplingParams(temperature=0, max_tokens=args.cost_steps, ignore_eos=True)
    run_workload(llm, prompt, params, 1)  # untimed: every kernel of the draft and the target
    # seconds in the step's one call to the proposer (``propose_many``; ``propose`` a request in
    # a tree from before the redesign), calls; the call reads its drafts back: its wall time is
    # its cost
    name = "propose_many" if hasattr(spec.proposer, "propose_many") else "propose"
    propose, drafting = getattr(spec.proposer, name), [0.0, 0]

    def timed(*a):
        start = time.perf_counter()
        out = propose(*a)
        drafting[0] += time.perf_counter() - start
        drafting[1] += 1
        return out

    setattr(spec.proposer, name, timed)
    for k in [0, *range(1, 9)]:
        sched.spec = spec if k else None
        spec.config = dataclasses.replace(spec.config, num_speculative_tokens=max(k, 1))
        drafting[:] = [0.0, 0]
        _, secs, tokens = run_workload(llm, prompt, params, 1)
        rec = dict(base, kind=f"{method}_cost", batch=1, k=k,
                   ms_per_step=round(secs * 1000 / tokens, 3),
                   draft_ms=round(drafting[0] * 1000 / max(drafting[1], 1), 3))
        records.append(rec)
        print(json.dumps(rec), flush=True)
    llm.close()
    for rec in records:
        rec["cost_vs_decode"] = round(rec["ms_per_step"] / records[0]["ms_per_step"], 3)
    return records


def write(records: list[dict], out: str, tag: str, command: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"spec_{tag}.json"), "w") as f:
        json.dump(records, f, indent=1)
    first = records[0]
    lines = [f"`{command}` on {first['gpu']}, commit `{first['commit']}`, model "
             f"`{first['model']}`.", ""]
    work = [r for r in records if r["kind"] == "workload"]
    if first["gpu"] == "cpu":
        lines += ["CPU tok/s are only indicative: the machine's cores are shared with other jobs, "
                  "so the acceptance columns are the result here.", ""]
    if work:
        lines += ["| workload | batch | method | tok/s | speedup | mean accepted len | "
                  "acceptance | identical |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['workload']} | {r['batch']} | {r['method']} | {r['tokens_per_s']} | "
                  f"{r['speedup']} | {r['mean_accepted_len']} | {r['acceptance_rate']} | "
                  f"{r['identical_to_baseline']} |" for r in work]
    cost = [r for r in records if r["kind"] in ("verify_cost", "eagle3_cost", "mtp_cost")]
    if cost:
        drafting = "draft_ms" in cost[0]  # a head's cost: the proposer's own time too
        lines += ["", "| batch | k | ms/step | x decode step |" + (" ms drafting |" * drafting),
                  "|---|---|---|---|" + ("---|" * drafting)]
        lines += [f"| {r['batch']} | {r['k']} | {r['ms_per_step']} | {r['cost_vs_decode']} |"
                  + (f" {r['draft_ms']} |" if drafting else "") for r in cost]
    with open(os.path.join(out, f"spec_{tag}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the built-in SmolLM2-135M")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--methods", default="none,ngram,suffix",
                        help="comma-separated; method:k drafts k tokens (else --num-spec-tokens)")
    parser.add_argument("--workloads", default="code,chat")
    parser.add_argument("--num-spec-tokens", type=int, default=None,
                        help="the most drafts (default: the method's own, 4; suffix: 15)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per shape (median)")
    parser.add_argument("--spec-options", default=None, help="more of the speculative config, "
                        "JSON (e.g. '{\"adaptive\": false}')")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--cuda-graph-bs", type=int, nargs="+", default=None,
                        help="the decode graphs captured (16 32 48 64: a one-row step replays "
                        "the 16-row graph, as a verify step does, so greedy tokens match in bf16)")
    parser.add_argument("--batch", type=int, default=1, help="also run the prompts N at a time")
    parser.add_argument("--verify-cost", action="store_true")
    parser.add_argument("--eagle3-cost", action="store_true")
    parser.add_argument("--mtp-cost", action="store_true")
    parser.add_argument("--cost-steps", type=int, default=32)
    parser.add_argument("--out", default="bench-out", help="results (./bench-out)")
    parser.add_argument("--tag", default=None)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() and args.device == "auto" else args.device
    gpu = gpu_name() if device != "cpu" else "cpu"
    base = {"model": args.model or "SmolLM2-135M-Instruct", "gpu": gpu,
            "date": datetime.date.today().isoformat(), "commit": project_commit()}
    if args.eagle3_cost or args.mtp_cost:
        method = "eagle3" if args.eagle3_cost else "mtp"
        records, tag = bench_head_cost(args, base, method), f"{method}_cost"
    elif args.verify_cost:
        records, tag = bench_verify_cost(args, base), "verify_cost"
    else:
        records, tag = bench_workloads(args, base), "workloads"
    tag = args.tag or tag
    write(records, args.out, tag, "python benchmark/offline/bench_spec.py " +
          " ".join(os.sys.argv[1:]))


if __name__ == "__main__":
    main()
