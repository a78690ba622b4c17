"""Record the choices this GPU's autotuned kernels make for a model, to ship them
(``minisgl/kernel/autotune_choices.py``: a new machine then compiles only the chosen
configurations, and times none).

    python benchmark/kernels/autotune_choices.py --model benchmark/configs/qwen3.5-9b.json \
        [--package fla] [--write] [--out DIR]

The model (a bare config gets random weights) serves prompts of one token, one chunk, several
chunks and a long prefill, and decodes a few tokens, so that each kernel meets the keys serving
gives it; the table goes to OUT and, with ``--write``, where the engine reads it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "offline"))

from bench_common import model_dir, project_commit  # noqa: E402

from minisgl import LLM, SamplingParams  # noqa: E402
from minisgl.kernel.autotune_choices import dump, table_path  # noqa: E402

PROMPT_LENS = "1,60,700,6000"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--package", default="fla", help="whose autotuned kernels")
    p.add_argument("--write", action="store_true", help="into minisgl/kernel/autotune_tables")
    p.add_argument("--prompt-lens", default=PROMPT_LENS, help="tokens of each prompt")
    p.add_argument("--out", default="bench-out")
    a = p.parse_args()
    lens = [int(n) for n in a.prompt_lens.split(",")]
    path, dummy = model_dir(a.model)
    llm = LLM(path, dummy_weights=dummy, warmup="off")
    start = time.perf_counter()
    prompts = [[(7 * i + n) % 390 + 10 for i in range(n)] for n in lens]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    seconds = time.perf_counter() - start
    choices = dump(a.package)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    doc = {"gpu": gpu, "triton": importlib.metadata.version("triton"),
           a.package: _version(a.package), "commit": project_commit(),
           "command": " ".join(["python", "benchmark/kernels/autotune_choices.py", *sys.argv[1:]]),
           "choices": choices}
    kernels, keys = len(choices), sum(map(len, choices.values()))
    print(f"{a.package} on {gpu}: {keys} keys of {kernels} autotuned kernels, chosen in "
          f"{seconds:.1f} s (prompts of {a.prompt_lens} tokens)", flush=True)
    os.makedirs(a.out, exist_ok=True)
    targets = [os.path.join(a.out, table_path(gpu, a.package).name)]
    if a.write:
        table_path(gpu, a.package).parent.mkdir(exist_ok=True)
        targets.append(str(table_path(gpu, a.package)))
    for target in targets:
        with open(target, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {target}")
    llm.close()


def _version(package: str) -> str:
    dist = {"fla": "fla-core"}.get(package, package)
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    main()
