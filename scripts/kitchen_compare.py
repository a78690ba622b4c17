"""The side-by-side table of ``gpu_kitchen.sh``: every result both trees wrote, the new tree's
figure over the old one's.

    python scripts/kitchen_compare.py OLD_DIR NEW_DIR

A result is keyed by its kind (the speculative workloads: workload, method, batch; the offline
benchmark: engine; a verify or EAGLE-3 step's cost: batch and drafts k); a key measured twice
(``gpu_kitchen.sh`` runs the workloads twice per tree) keeps its best figure. Throughputs are
better higher, latencies lower; the ratio says new / old for throughput and old / new for
latency, so above 1 is faster either way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# (field, higher is better)
FIGURES = (("tokens_per_s", True), ("output_tok_per_s", True), ("ms_per_token", False),
           ("ms_per_step", False))


def results(folder: str) -> dict[tuple, tuple[str, float, bool]]:
    """Key -> (figure's name, value, higher is better), the best of each key's runs."""
    best: dict[tuple, tuple[str, float, bool]] = {}
    for path in sorted(Path(folder).glob("*.json")):
        for rec in json.loads(path.read_text()):
            key = (rec.get("model"), rec.get("workload") or rec.get("engine") or rec.get("kind"),
                   rec.get("method", ""), rec.get("batch", ""), rec.get("k", ""))
            for name, higher in FIGURES:
                if rec.get(name) is None:
                    continue
                value = float(rec[name])
                old = best.get(key)
                if old is None or (value > old[1] if higher else value < old[1]):
                    best[key] = (name, value, higher)
                break
    return best


def main() -> None:
    old, new = results(sys.argv[1]), results(sys.argv[2])
    lines = ["| model | workload / engine | method | batch | k | figure | old | new | faster |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(old.keys() & new.keys(), key=str):
        name, a, higher = old[key]
        b = new[key][1]
        ratio = (b / a if higher else a / b) if a and b else float("nan")
        lines.append("| " + " | ".join(str(k) for k in key)
                     + f" | {name} | {a:.2f} | {b:.2f} | {ratio:.3f}x |")
    for label, only in (("old", old.keys() - new.keys()), ("new", new.keys() - old.keys())):
        if only:
            keys = ", ".join(map(str, sorted(only, key=str)))
            lines.append(f"\nonly in the {label} tree: {keys}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
