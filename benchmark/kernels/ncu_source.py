"""Where a kernel's warps wait, by instruction: Nsight Compute's source page (SASS) summed.

    ncu --section SourceCounters --section WarpStateStats -o REPORT ...
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > source.csv
    python benchmark/kernels/ncu_source.py source.csv [--top 30]

The stall samples are charged to the instruction a warp waits to issue: a ``DEPBAR`` waiting
for ``cp.async`` data, a ``BAR.SYNC`` at a CTA barrier, an ``HGMMA`` or ``WARPGROUP.DEPBAR``
behind the tensor cores, the first use of a shared-memory load. Prints, for each kernel of the
page, its instructions with the most samples and the samples by opcode (markdown).
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import Counter

ALL = "Warp Stall Sampling (All"
NOT_ISSUED = "Warp Stall Sampling (Not-issued"


def _number(cell: str) -> float:
    try:
        return float(cell.replace(",", "") or 0)
    except ValueError:
        return 0.0


def tables(path: str) -> list[list[dict[str, str]]]:
    """The page's SASS tables (one a kernel): each row a dict by column name. A table starts
    at a header row naming the source and the stall samples."""
    out: list[list[dict[str, str]]] = []
    header: list[str] | None = None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if "Source" in row and any(c.startswith(ALL) for c in row):
                header = row
                out.append([])
            elif header and len(row) == len(header):
                out[-1].append(dict(zip(header, row)))
    return out


def opcode(source: str) -> str:
    """``@!P0 LDGSTS.E.BYPASS.128 [R0], ...`` -> ``LDGSTS``."""
    words = source.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return re.split(r"[.\s]", words[0])[0] if words else "?"


def report(rows: list[dict[str, str]], top: int) -> str:
    all_col = next(c for c in rows[0] if c.startswith(ALL))
    nis_col = next((c for c in rows[0] if c.startswith(NOT_ISSUED)), None)
    total = sum(_number(r[all_col]) for r in rows) or 1.0
    lines = [f"{len(rows)} instructions, {total:,.0f} stall samples", "",
             "| address | instruction | samples | share | not issued |", "|---|---|---|---|---|"]
    ranked = sorted(rows, key=lambda r: -_number(r[all_col]))[:top]
    for r in ranked:
        n = _number(r[all_col])
        lines.append(f"| {r.get('# Address', r.get('Address', ''))} | `{r['Source'].strip()}` | "
                     f"{n:,.0f} | {n / total:.1%} | "
                     f"{_number(r[nis_col]) if nis_col else 0:,.0f} |")
    by_op: Counter[str] = Counter()
    for r in rows:
        by_op[opcode(r["Source"])] += _number(r[all_col])
    lines += ["", "| opcode | samples | share |", "|---|---|---|"]
    lines += [f"| {op} | {n:,.0f} | {n / total:.1%} |" for op, n in by_op.most_common(15)]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv", help="ncu --page source --csv --print-source sass")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    found = [t for t in tables(a.csv) if t]
    if not found:
        raise SystemExit(f"{a.csv}: no SASS table with a '{ALL}...' column")
    for i, rows in enumerate(found):
        print(f"## kernel {i}\n\n{report(rows, a.top)}\n")


if __name__ == "__main__":
    main()
