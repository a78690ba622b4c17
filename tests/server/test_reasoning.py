"""Reasoning output: ``<think>...</think>`` (and Gemma 4's ``<|channel>thought\\n...<channel|>``)
split into ``reasoning_content``, whole and streamed.

The parser is checked on text cut at every place (a tag split across chunks); end to end, a tiny
Qwen3 checkpoint gets a word-level tokenizer whose ``</think>`` is a token the model's greedy
output really contains, and a thinking chat template (``enable_thinking`` as Qwen3's), so the
server's split can be checked against transformers' tokens.
"""

from __future__ import annotations

import itertools

import openai
import pytest

from helpers.gemma_tools_model import GEMMA4_THINKING_TEMPLATE, byte_tokenizer
from minisgl.server.openai.reasoning import (
    CHANNEL,
    THINK,
    ReasoningConfig,
    ReasoningSplitter,
    split,
)

QWEN3 = "<think>\nLet me see.\n2 + 2 is 4.\n</think>\n\nThe answer is 4."
CASES = [  # (output, the prompt opened <think>, (reasoning, content))
    (QWEN3, False, ("Let me see.\n2 + 2 is 4.", "The answer is 4.")),
    ("Hi there", False, (None, "Hi there")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("<think>\n\n</think>\n\nok", False, ("", "ok")),
    ("<think>unfinished", False, ("unfinished", "")),
    ("<thinking> is a word", False, (None, "<thinking> is a word")),
    ("no tag: <think>x</think>y", False, (None, "no tag: <think>x</think>y")),
    ("a</think>b </think> c", False, (None, "a</think>b </think> c")),
    ("Let me see.\n</think>\n\nAnswer", True, ("Let me see.", "Answer")),
    ("<think>x</think>y", True, ("x", "y")),
    ("still thinking", True, ("still thinking", "")),
    ("a</think>b</think>c", True, ("a", "b</think>c")),
    ("x </thin", True, ("x </thin", "")),
    ("", True, ("", "")),
    ("<", False, (None, "<")),
]
GEMMA4 = "<|channel>thought\nThe user wants 2 + 2.\n<channel|>4"
GEMMA4_CASES = [  # Gemma 4's thought channel; "thought" names the channel
    (GEMMA4, False, ("The user wants 2 + 2.", "4")),
    ("4", False, (None, "4")),  # thinking off: the prompt closed an empty channel
    ("<|channel>thought\n<channel|>\n\nHi", False, ("", "Hi")),
    ("<|channel>thought\nstill thinking", False, ("still thinking", "")),
    ("<|channel>thought\nx<channel|>y<channel|>z", False, ("x", "y<channel|>z")),
    ("<|channel>", False, (None, "<|channel>")),
    ("<|channel>other<channel|>x", False, (None, "<|channel>other<channel|>x")),
    ("<think>x</think>y", False, (None, "<think>x</think>y")),  # another family's tags: text
    ("See <|channel>thought\nx<channel|>", False, (None, "See <|channel>thought\nx<channel|>")),
    ("x<channel|>y", True, ("x", "y")),
]
ALL = [(t, o, e, THINK) for t, o, e in CASES] + [(t, o, e, CHANNEL) for t, o, e in GEMMA4_CASES]


@pytest.mark.parametrize("text, opened, expected, tags", ALL)
def test_split_whole_text(text, opened, expected, tags):
    assert split(text, opened, tags) == expected


@pytest.mark.parametrize("text, opened, expected, tags", ALL)
def test_streamed_pieces_give_the_same_split(text, opened, expected, tags):
    """Every way of cutting the text in two and three pieces, and char by char."""
    n = len(text)
    cuts = [list(c) for k in (1, 2) for c in itertools.combinations(range(1, n), k)] + \
        [list(range(1, n))]
    for cut in cuts:
        splitter = ReasoningSplitter(opened, tags)
        reasoning = content = ""
        for a, b in zip([0, *cut], [*cut, n]):
            r, c = splitter.feed(text[a:b])
            reasoning, content = reasoning + r, content + c
        r, c = splitter.finish()
        got = (reasoning + r if splitter.entered else None, content + c)
        assert got == expected, (cut, got)


def test_close_tag_split_across_chunks_is_never_shown():
    splitter = ReasoningSplitter(True)
    assert splitter.feed("abc</th") == ("abc", "")
    assert splitter.feed("ink>\n") == ("", "")
    assert splitter.feed("\nDone") == ("", "Done")
    gemma = ReasoningSplitter(False, CHANNEL)
    assert gemma.feed("<|chan") == ("", "")
    assert gemma.feed("nel>thought\nhmm<chan") == ("hmm", "")
    assert gemma.feed("nel|>Ok") == ("", "Ok")


class _Tok:
    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, **kwargs):
        if kwargs.get("enable_thinking") is False:
            return "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        return "<|im_start|>assistant\n" + ("<think>\n" if "OPEN" in self.chat_template else "")


def test_config_resolves_from_the_template():
    qwen3, r1_style, plain = _Tok("... <think> ..."), _Tok("OPEN <think>"), _Tok("{{ messages }}")
    auto = ReasoningConfig("auto")
    assert auto.enabled(qwen3) and not auto.enabled(plain)
    assert auto.starts_in_reasoning(qwen3, None) is False
    assert auto.starts_in_reasoning(r1_style, None) is True
    assert auto.starts_in_reasoning(r1_style, {"enable_thinking": False}) is False
    assert ReasoningConfig("deepseek-r1").starts_in_reasoning(qwen3, None) is True
    assert not ReasoningConfig("none").enabled(qwen3)
    assert ReasoningConfig("qwen3").enabled(plain)
    with pytest.raises(ValueError, match="reasoning_parser"):
        ReasoningConfig("r1")


_PROBE = [{"role": "user", "content": "Hi"}]


def test_gemma4_config_from_its_template():
    """A template in Gemma 4's shape picks the channel's tags; without ``enable_thinking`` its
    prompt closes an empty channel, with it the model opens the channel itself."""
    tok = byte_tokenizer(GEMMA4_THINKING_TEMPLATE)
    auto = ReasoningConfig("auto")
    assert auto.tags(tok) == CHANNEL and ReasoningConfig("qwen3").tags(tok) == THINK
    assert ReasoningConfig("gemma4").tags(_Tok("{{ messages }}")) == CHANNEL
    assert auto.tags(_Tok("... <think> ...")) == THINK
    assert auto.starts_in_reasoning(tok, None) is False
    assert auto.starts_in_reasoning(tok, {"enable_thinking": True}) is False
    off = tok.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True)
    on = tok.apply_chat_template(_PROBE, tokenize=False, add_generation_prompt=True,
                                 enable_thinking=True)
    assert off.endswith("<|channel>thought\n<channel|>") and on.endswith("<|turn>model\n")
    assert "<|think|>" in on and "<|think|>" not in off


# ------------------------------------------------------------------------------ end to end
TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|>{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant "
    "{%- if enable_thinking is defined and enable_thinking is false %} <think> </think>"
    "{%- else %} <think>{%- endif %}{%- endif %}"
)
SPECIAL = ["<unk>", "<s>", "<|im_end|>", "<|im_start|>"]  # ids 0-3 (eos 2 as the checkpoints')
THINK_OPEN = 4
NEW = 10


def _tokenizer(close_id: int | None):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = SPECIAL + ["<think>", "user", "assistant", "system"]
    words += [f"w{i}" for i in range(len(words), 256)]
    if close_id is not None:
        words[close_id] = "</think>"
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>",
                                  eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.add_tokens([AddedToken(w, special=False, normalized=False)
                    for w in ("<think>", "</think>") if w in words])
    tok.chat_template = TEMPLATE
    return tok


def _prompt(tok, word: str, **kwargs) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": word}], tokenize=False,
                                   add_generation_prompt=True, **kwargs)
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    """A checkpoint and tokenizer, a user word, and transformers' greedy outputs with thinking on
    and off. ``</think>`` is the id that the thinking output has once, in its middle."""
    from helpers.hf_models import greedy_margins, hf_greedy, make_tiny_checkpoint

    path = make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("think") / "qwen3")
    draft = _tokenizer(None)
    for k in range(8, 60):
        word = f"w{k}"
        prompt = _prompt(draft, word)
        out = hf_greedy(path, [prompt], NEW)[0]
        if min(greedy_margins(path, [prompt], [out])[0]) < 1e-2 or out[0] == THINK_OPEN:
            continue
        close = next((t for j, t in enumerate(out) if 2 <= j <= NEW - 3 and out.count(t) == 1
                      and t >= 8 and t not in prompt), None)
        if close is None:
            continue
        tok = _tokenizer(close)
        plain_prompt = _prompt(tok, word, enable_thinking=False)
        plain = hf_greedy(path, [plain_prompt], NEW)[0]
        if plain[0] == THINK_OPEN or min(greedy_margins(path, [plain_prompt], [plain])[0]) < 1e-2:
            continue
        tok.save_pretrained(path)
        return path, tok, word, out, close, plain
    pytest.fail("no user word gives a usable greedy output")


@pytest.mark.slow
def test_server_splits_reasoning(thinking_model, tmp_path):
    from helpers.server_utils import start_server

    path, tok, word, out, close, plain = thinking_model
    j = out.index(close)
    want_reasoning = tok.decode(out[:j], skip_special_tokens=True).strip()
    want_content = tok.decode(out[j + 1:], skip_special_tokens=True).strip()
    assert want_reasoning and want_content and "</think>" not in want_content
    server = start_server(str(path), "--num-pages", "512", log_dir=str(tmp_path))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        ask = dict(model=str(path), messages=[{"role": "user", "content": word}], max_tokens=NEW,
                   temperature=0)
        extra = {"ignore_eos": True}
        msg = client.chat.completions.create(**ask, extra_body=extra).choices[0].message
        assert msg.content == want_content
        assert msg.reasoning_content == want_reasoning
        chunks = list(client.chat.completions.create(**ask, stream=True, extra_body=extra))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) \
            == want_reasoning
        assert "".join(d.content or "" for d in deltas) == want_content
        assert not any("</think>" in (d.content or "") for d in deltas)
        # chat_template_kwargs reach the template: the prompt closes the reasoning itself
        off = client.chat.completions.create(
            **ask, extra_body={**extra, "chat_template_kwargs": {"enable_thinking": False}})
        assert off.usage.prompt_tokens == len(_prompt(tok, word, enable_thinking=False))
        assert off.choices[0].message.content == tok.decode(plain, skip_special_tokens=True)
        assert off.choices[0].message.reasoning_content is None
        raw = client.chat.completions.create(**ask, extra_body={**extra,
                                                                "separate_reasoning": False})
        assert raw.choices[0].message.content == tok.decode(out, skip_special_tokens=True)
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**ask, extra_body={"chat_template_kwargs":
                                                              {"tokenize": True}})
        assert e.value.body["param"] == "chat_template_kwargs"
    finally:
        server.stop()


def test_llm_chat_template_kwargs(thinking_model):
    from minisgl import LLM

    path, tok, word, *_ = thinking_model
    with LLM(str(path), device="cpu", dtype="float32", num_pages=256) as llm:
        chat = [{"role": "user", "content": word}]
        assert llm.apply_chat_template(chat) == _prompt(tok, word)
        off = llm.apply_chat_template(chat, enable_thinking=False)
        assert off == _prompt(tok, word, enable_thinking=False) != _prompt(tok, word)
