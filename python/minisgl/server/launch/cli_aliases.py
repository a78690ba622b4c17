"""vLLM's and SGLang's spellings of minisgl's flags, so that a command line copied from either
works (the table, shared with the offline ``LLM``'s keywords, is ``llm/aliases.py``).

Three kinds: a flag that means exactly one of ours is a second name of it (``ALIASES``, shown in
``--help``); a flag whose values need translating sets our option through a converter
(``--attention-backend FLASHINFER`` is ``--attn fi``); a flag whose meaning differs, or that has no
counterpart, fails with a message naming what to use instead (``DIFFERENT``). Any other unknown flag
fails with argparse's usual error plus the closest minisgl flags.
"""

from __future__ import annotations

import argparse
import difflib

from minisgl.llm.aliases import ALIASES, ALWAYS_ON, DIFFERENT, DTYPE_NAMES, attention_backend

__all__ = ["ALIASES", "ALWAYS_ON", "DIFFERENT", "DTYPE_NAMES", "add_translated_aliases",
           "parse_known_flags", "speculative_steps"]


def _attention_backend(value: str) -> str:
    try:
        return attention_backend(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_translated_aliases(parser: argparse.ArgumentParser) -> None:
    """Flags that set one of our options through a translation (they never override a default)."""
    group = parser.add_argument_group("vLLM / SGLang spellings")
    group.add_argument("--attention-backend", dest="attn", type=_attention_backend,
                       default=argparse.SUPPRESS, help="the same as --attn, with vLLM's or "
                       "SGLang's backend names (FLASHINFER, fa3, triton, ...)")
    for flag in ("--disable-radix-cache", "--no-enable-prefix-caching"):
        group.add_argument(flag, dest="cache", action="store_const", const="naive",
                           default=argparse.SUPPRESS, help="the same as --cache naive")
    group.add_argument("--disable-hybrid-swa-memory", dest="sliding_pool_ratio",
                       action="store_const", const=0.0, default=argparse.SUPPRESS,
                       help="the same as --sliding-pool-ratio 0")
    group.add_argument("--skip-server-warmup", dest="warmup", action="store_const", const="off",
                       default=argparse.SUPPRESS, help="the same as --warmup off")
    for flag, meaning in ALWAYS_ON.items():
        group.add_argument(flag, dest="always_on", action="append_const", const=flag,
                           default=argparse.SUPPRESS, help=f"accepted: {meaning}")
    group.add_argument("--speculative-num-steps", dest="speculative_num_steps", type=int,
                       default=argparse.SUPPRESS, help="SGLang's draft steps S (one chain): the "
                       "same as --speculative-num-draft-tokens S+1")
    group.add_argument("--speculative-eagle-topk", dest="speculative_eagle_topk",
                       type=_eagle_topk, default=argparse.SUPPRESS,
                       help="accepted as 1 only: minisgl verifies one chain of drafts, no tree")
    for flag in ("--enforce-eager", "--disable-cuda-graph"):
        group.add_argument(flag, action=_NoCudaGraphs, nargs=0, default=argparse.SUPPRESS,
                           help="the same as --cuda-graph-max-bs 0 "
                                "--piecewise-cuda-graph-max-tokens 0")


def _eagle_topk(value: str) -> int:
    if value.strip() != "1":
        raise argparse.ArgumentTypeError(
            f"{value!r}: minisgl drafts one chain (top-k 1), not a tree; drop the flag or give 1")
    return 1


def speculative_steps(ns: dict) -> None:
    """SGLang's ``--speculative-num-steps S`` (with top-k 1: S drafts) as ours, N = S + 1
    verified tokens; a different explicit N is an error, as it would be a tree in SGLang."""
    ns.pop("speculative_eagle_topk", None)
    steps = ns.pop("speculative_num_steps", None)
    if steps is None:
        return
    if steps < 1:
        raise ValueError(f"speculative_num_steps: must be >= 1, got {steps}")
    given = ns.get("speculative_num_draft_tokens")
    if given is not None and given != steps + 1:
        raise ValueError(f"speculative_num_steps: {steps} steps of one chain verify {steps + 1} "
                         f"tokens, not --speculative-num-draft-tokens {given}")
    ns["speculative_num_draft_tokens"] = steps + 1


class _NoCudaGraphs(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        namespace.cuda_graph_max_bs = 0
        namespace.piecewise_cuda_graph_max_tokens = 0


def parse_known_flags(parser: argparse.ArgumentParser,
                      argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, with a pointer to the minisgl flag for every unknown one."""
    ns, rest = parser.parse_known_args(argv)
    unknown = [arg.split("=", 1)[0] for arg in rest if arg.startswith("-")]
    if not rest:
        return ns
    if not unknown:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    problems = []
    known = [s for action in parser._actions for s in action.option_strings]
    for flag in unknown:
        if flag in DIFFERENT:
            problems.append(f"{flag}: {DIFFERENT[flag]}")
            continue
        close = difflib.get_close_matches(flag, known, n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        problems.append(f"unrecognized argument {flag}{hint}")
    parser.error("; ".join(problems))
    raise AssertionError("unreachable")  # parser.error exits
