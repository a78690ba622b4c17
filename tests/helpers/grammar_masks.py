"""A grammar compiler's masks along a short path through a few grammars: what a compiler built
another way (tables read from a cache, grammars read back) must reproduce."""

from __future__ import annotations

import torch

from minisgl.sampling import unpack_bitmask
from minisgl.structured import GrammarCompiler, new_bitmask

GRAMMARS = [("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}'),
            ("regex", "(yes|no)!"), ("ebnf", 'root ::= "x" [0-9]+')]


def grammar_masks(compiler: GrammarCompiler, vocab: int) -> list[torch.Tensor]:
    """Each grammar's allowed tokens at its start and after its matcher's first allowed token."""
    rows = []
    for kind, source in GRAMMARS:
        matcher = compiler.matcher(compiler.compile(kind, source))
        for _ in range(2):
            mask = new_bitmask(1, compiler.mask_vocab_size)
            matcher.fill(mask, 0)
            allowed = unpack_bitmask(mask, vocab)[0]
            rows.append(allowed)
            assert matcher.accept(int(allowed.nonzero()[0]))
    return rows
