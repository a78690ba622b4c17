"""The warm-up plan: which forwards and which samplings reach every kernel variant a request can.

Pure data from the engine's configuration, computed the same on every machine:

- ``forwards``: prefill sizes on both sides of the kernels' thresholds (1 token, odd sizes,
  multiples of 16, each side of the FP8 GEMM thresholds and of the piecewise graphs' largest
  size, the largest forward, the chunk after it), a prefix hit off a page boundary, mixed steps
  (decode rows beside prefill chunks) and decode batches the graphs do not hold; the graphs'
  own batch sizes come from the engine (``ShadowEngine.graph_sizes``).
- ``sampler_cases``: one case per combination of what the sampling kernels specialise on
  (penalty counts, a logit bias, a grammar mask, log-probs with none, 8 or 32 top entries).

``FEATURE_STAGES`` orders the sampler's features for the part of the compilation that runs after
the server reports ready: stage k compiles every case whose features are among the first k, so a
request whose features are all in finished stages can run in any batch of such requests without
compiling anything (``request_features``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from minisgl.core import SamplingParams

# prompt lengths on CUDA: 1, odd and multiple-of-16 sizes, and one on each side of the FP8 GEMM
# thresholds (32, 96, 256 tokens)
PREFILL_LENS = (1, 2, 7, 16, 33, 64, 97, 130, 255, 300, 520, 1000, 2100, 4100)
# the sampler's features in the order they are compiled after ready (the module docstring)
FEATURE_STAGES = ("sampled", "logprobs", "top-logprobs", "penalties", "bias", "grammar")
SCHEMA = ('{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, '
          '"n": {"type": "integer"}}, "required": ["name", "n"]}')


@dataclass(frozen=True)
class ForwardShape:
    """One forward: ``decode`` one-token rows of ``context`` tokens each, then a chunk of each of
    ``extends`` tokens after ``prefix`` cached ones."""

    decode: int = 0
    extends: tuple[int, ...] = ()
    prefix: int = 0
    context: int = 64

    @property
    def name(self) -> str:
        parts = [f"decode {self.decode}"] if self.decode else []
        if self.extends:
            hit = f" after {self.prefix}" if self.prefix else ""
            parts.append(f"prefill {'+'.join(map(str, self.extends))}{hit}")
        return ", ".join(parts)


@dataclass(frozen=True)
class SamplerCase:
    """A batch's sampling switches (``params`` on each of its rows) and the features they use."""

    name: str
    params: SamplingParams
    features: frozenset[str]

    @property
    def stage(self) -> int:
        """The first stage of ``FEATURE_STAGES`` (1-based) after which this case is compiled."""
        return feature_stage(self.features)


def feature_stage(features: frozenset[str] | set[str]) -> int:
    """0 for no feature (greedy, compiled before ready); else the 1-based stage of
    ``FEATURE_STAGES`` that brings the last of ``features``."""
    return max((FEATURE_STAGES.index(f) + 1 for f in features), default=0)


def request_features(params: SamplingParams) -> frozenset[str]:
    """The sampler features a request's rows need (``FEATURE_STAGES``)."""
    features = set()
    plain = not (params.needs_penalties or params.logit_bias or params.grammar is not None)
    if not params.is_greedy or not plain or params.logprobs or params.top_logprobs:
        features.add("sampled")
    if params.logprobs or params.top_logprobs:
        features.add("logprobs")
    if params.top_logprobs:
        features.add("top-logprobs")
    if params.needs_penalties:
        features.add("penalties")
    if params.logit_bias:
        features.add("bias")
    if params.grammar is not None:
        features.add("grammar")
    return frozenset(features)


def sampler_variants(base: SamplingParams, grammar: bool) -> dict[str, SamplingParams]:
    """One ``SamplingParams`` per combination of what the sampling kernels specialise on: penalty
    counts, a logit bias, a grammar mask (each a compile-time switch of the batch), and log-probs
    (none, the sampled token's, the top 8 or top 32: ``sampling/kernels/launch.py``). A batch
    takes the union of its rows' switches, so every combination is reachable."""
    variants = {}
    for counts, bias, mask in itertools.product((False, True), repeat=3):
        if mask and not grammar:
            continue
        params = replace(base, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, seed=1)
        if counts:
            params = replace(params, presence_penalty=0.5, frequency_penalty=0.3,
                             repetition_penalty=1.1)
        if bias:
            params = replace(params, logit_bias=((1, 2.0), (2, -2.0)))
        if mask:
            params = replace(params, json_schema=SCHEMA, ignore_eos=False)
        name = "+".join(n for n, on in (("penalties", counts), ("bias", bias), ("grammar", mask))
                        if on) or "top-k/top-p/min-p"
        variants[name] = params
        for top in (0, 3, 20):  # the token's log-prob; the top 8 merge; the top 32
            variants[f"{name}+logprobs{top}"] = replace(params, logprobs=True, top_logprobs=top)
    variants["greedy"] = base
    variants["prompt-log-probs"] = replace(base, prompt_logprobs=True)
    return variants


def sampler_cases(grammar: bool) -> list[SamplerCase]:
    """Every combination of the sampling kernels' compile-time switches (``sampler_variants``),
    each with the features it needs compiled."""
    base = SamplingParams(max_tokens=3, ignore_eos=True)
    return [SamplerCase(name, p, request_features(p))
            for name, p in sampler_variants(base, grammar).items()
            if name not in ("greedy", "prompt-log-probs")]


@dataclass(frozen=True)
class KernelPlan:
    forwards: tuple[ForwardShape, ...]
    sampler_cases: tuple[SamplerCase, ...]


def kernel_plan(*, max_forward_tokens: int, max_seq_len: int, max_running_reqs: int,
                graph_max_bs: int, piecewise_max_tokens: int, page_size: int,
                grammar: bool) -> KernelPlan:
    """The plan of an engine (the module docstring); sizes are capped by what it can run."""
    longest = max(1, min(max_forward_tokens, max_seq_len - 2))
    lens = {min(n, longest) for n in (*PREFILL_LENS, longest)}
    if piecewise_max_tokens:  # each side of the largest piecewise graph
        lens |= {min(n, longest) for n in (piecewise_max_tokens, piecewise_max_tokens + 1)}
    forwards = [ForwardShape(extends=(n,)) for n in sorted(lens)]
    if max_seq_len > longest + 40:  # the chunk after a full one: a prefix of a whole forward
        forwards.append(ForwardShape(extends=(37,), prefix=longest))
    prefix = min(600, longest // 2) // page_size * page_size + (page_size > 1)
    if prefix and max_seq_len > prefix + 45:  # a prefix hit, off a page boundary
        forwards.append(ForwardShape(extends=(45,), prefix=prefix))
    for decode, extends in ((1, (19,)), (3, (100, 700)), (2, (min(3000, longest - 3),))):
        if decode + sum(extends) <= max_forward_tokens and decode < max_running_reqs:
            forwards.append(ForwardShape(decode=decode, extends=extends))
    # decode batches beyond the graphs run eagerly (all of them with graphs off)
    eager = [1, 2, 7, 33] if not graph_max_bs else [graph_max_bs + 1]
    forwards += [ForwardShape(decode=min(n, max_running_reqs)) for n in eager
                 if not graph_max_bs or n <= max_running_reqs]
    return KernelPlan(tuple(dict.fromkeys(forwards)), tuple(sampler_cases(grammar)))
