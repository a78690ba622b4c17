"""What a grammar never seen costs on its first request: compiling tool-call schemas with xgrammar
on 1 to N threads (``GrammarCompiler(max_threads=...)``: 2 to 4 in the scheduler, by the CPUs),
on one tokenizer.

    python benchmark/kernels/bench_grammar_compile.py [--tokenizer DIR] [--schemas 8]
        [--threads 1,2,4,8] [--out DIR]

``--tokenizer``: a directory with a tokenizer (default: the default model's; a copy of its files
without weights serves, ``spec_ab.py --save-config``). Each schema is a forced call of one of a
few tools whose argument objects differ (so no two compile alike); each thread count gets a fresh
compiler. The median ms a schema; writes ``grammar_compile_<where>.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import project_commit  # noqa: E402

from minisgl.structured import GrammarCompiler, TokenizerTables  # noqa: E402
from minisgl.utils import usable_cpus  # noqa: E402
from minisgl.utils.hf import load_tokenizer  # noqa: E402


def tool_schema(i: int) -> str:
    """A forced call of a tool whose arguments have a few typed fields (``i`` makes it unique)."""
    fields = {f"field_{i}_{j}": {"type": ["string", "integer", "boolean", "number"][j % 4]}
              for j in range(6)}
    fields["unit"] = {"enum": ["celsius", "fahrenheit"]}
    args = {"type": "object", "properties": fields, "required": list(fields)[:2]}
    return json.dumps({"type": "object", "properties": {"name": {"const": f"tool_{i}"},
                                                        "arguments": args},
                       "required": ["name", "arguments"]})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--schemas", type=int, default=8)
    p.add_argument("--threads", default="1,2,4,8")
    p.add_argument("--out", default="bench-out")
    args = p.parse_args()
    if args.tokenizer is None:
        from minisgl.models.default_model import default_model_path

        args.tokenizer = default_model_path()
    tokenizer = load_tokenizer(args.tokenizer)
    tables = TokenizerTables.from_tokenizer(tokenizer, (tokenizer.eos_token_id,))
    rows = []
    for n, threads in enumerate(int(t) for t in args.threads.split(",")):
        compiler = GrammarCompiler(tables, tables.length, max_threads=threads)
        compiler.compile("json_schema", '{"type": "object"}')  # its pool started
        times = []
        for i in range(args.schemas):
            start = time.perf_counter()
            compiler.compile("json_schema", tool_schema(1000 * n + i))
            times.append(time.perf_counter() - start)
        rows.append({"how": f"compile, {threads} threads",
                     "ms": round(statistics.median(times) * 1e3, 2)})
        print(json.dumps(rows[-1]), flush=True)
    cpus = usable_cpus()
    where = f"cpu{cpus}"
    info = {"date": datetime.date.today().isoformat(), "commit": project_commit(), "cpus": cpus,
            "tokenizer_vocab": tables.length, "schemas": args.schemas, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"grammar_compile_{where}")
    with open(stem + ".json", "w") as f:
        json.dump(info, f, indent=1)
    lines = [f"A tool-call schema's grammar on {cpus} CPUs, commit `{info['commit']}`, "
             f"{info['date']}: a tokenizer of {tables.length} tokens, median ms of "
             f"{args.schemas} schemas.", "", "| how | ms |", "|---|---|"]
    lines += [f"| {r['how']} | {r['ms']} |" for r in rows]
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
