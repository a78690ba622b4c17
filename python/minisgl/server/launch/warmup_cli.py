"""``python -m minisgl warmup``: fill a kernel cache without serving.

    python -m minisgl warmup --model Qwen/Qwen3-8B --cache-dir /opt/kernels [server flags]

Takes the server's flags (give it those the server will get: the variants depend on the model,
the dtype, the batch sizes, ...), builds the engine the server would on this GPU with random
weights (only the model's ``config.json`` is read: no checkpoint is needed), compiles every
kernel variant on all cores, runs the warm-up's greedy requests (autotuned kernels keep their
choice), builds the grammar compiler's tables of the tokenizer, and writes all of it under
``--cache-dir`` (the layout of ``minisgl/warmup/cache.py``).
A server or ``LLM`` given that directory on a machine with the same GPU and versions starts as a
restart does.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time


def parse(argv: list[str]):
    """The server's ``ServerConfig`` for ``argv``; ``ValueError`` for what a warm-up cannot do."""
    from minisgl.server.launch.args import parse_args

    config = parse_args(argv)
    if config.engine.cache_dir is None:
        raise ValueError("--cache-dir: the directory to fill is required")
    if config.tp != 1 or config.dp != 1 or config.nnodes != 1:
        raise ValueError("tp, dp, nnodes: the warm-up builds one engine (tp 1); a server with "
                         "--cache-dir fills the cache of a larger layout on its first start")
    if config.engine.device == "cpu":
        raise ValueError("device: a CPU compiles no kernels")
    engine = dataclasses.replace(config.engine, dummy_weights=True, warmup="on")
    return dataclasses.replace(config, engine=engine)


def main(argv: list[str]) -> int:
    start = time.perf_counter()
    try:
        config = parse(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: the warm-up compiles for this machine's GPU; none is present",
              file=sys.stderr)
        return 2
    from minisgl.models import eos_token_ids
    from minisgl.models.weight import resolve_model_path
    from minisgl.scheduler import Scheduler
    from minisgl.scheduler.warmup import warm_up
    from minisgl.utils.hf import load_tokenizer

    model_path = resolve_model_path(config.model, config.revision)
    eos = eos_token_ids(model_path)
    scheduler = Scheduler(config.engine.scheduler_config(model_path, eos, online=True))
    try:
        kernels = scheduler.kernels
        assert kernels is not None  # CUDA with precompile
        kernels.wait_all()
        warm_up(scheduler)
        scheduler.grammar.wait_prepared()  # the tokenizer's tables, kept beside the kernels
        # and the class AutoTokenizer chooses, which the tokenizer workers import alone
        # (``utils/tokenizer_class.py``: keyed by the directory too, so serve from the same path)
        if os.path.isdir(tokenizer_dir := config.tokenizer or model_path):
            load_tokenizer(tokenizer_dir, cache_dir=config.engine.tokenizer_cache_dir())
        done = kernels.compiled
    finally:
        scheduler.close()
    print(f"kernel cache {config.engine.cache_dir}: {done} variants compiled or loaded in "
          f"{time.perf_counter() - start:.1f} s")
    return 0
