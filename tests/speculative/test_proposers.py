"""Proposers, the adaptive draft length and the speculative flags, without a model."""

from __future__ import annotations

import numpy as np
import pytest

from minisgl.core import Req, SamplingParams
from minisgl.llm.config import EngineOptions
from minisgl.server.launch.args import parse_args
from minisgl.speculative import SpecConfig, create_proposer, parse_speculative_config
from minisgl.speculative.adaptive import Acceptance, StepCost
from minisgl.speculative.decoder import AHEAD_MIN
from minisgl.speculative.ngram import lookup


def req(ids: list[int], uid: int = 0, prompt_len: int | None = None) -> Req:
    return Req(uid=uid, input_ids=list(ids), prompt_len=prompt_len or len(ids),
               sampling_params=SamplingParams(), max_device_len=1000)


def test_ngram_takes_the_longest_match_and_its_latest_occurrence():
    tokens = np.array([1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 4, 1, 2, 3])
    # "1 2 3" (n=3) occurred at the start: it beats the later "2 3" (n=2)
    assert lookup(tokens, 2, 3, 3) == [9, 9, 5]
    # with n <= 2, the latest "2 3" wins
    assert lookup(tokens, 2, 2, 3) == [7, 8, 4]
    assert lookup(tokens, 4, 5, 3) == []  # no 4-gram repeats
    assert lookup(np.array([5, 5, 5, 5]), 2, 3, 4) == [5]  # an overlapping match


def test_ngram_proposer_follows_a_growing_request():
    p = create_proposer(SpecConfig(method="ngram", prompt_lookup_min=1, prompt_lookup_max=3))
    r = req([10, 11, 12, 13, 10, 11])
    assert p.propose(r, 2) == [12, 13]
    r.input_ids += [12, 13, 99] + [0] * 300  # past the initial buffer
    r.input_ids += [12, 13]
    assert p.propose(r, 3) == [99, 0, 0]
    p.finished(r)
    assert not p.history


def test_suffix_proposer_uses_own_history_and_other_requests():
    p = create_proposer(SpecConfig(method="suffix", max_tree_depth=8))
    first = req([1, 2, 3, 4, 5, 6, 7, 8], uid=1, prompt_len=2)
    assert p.propose(first, 4) == []  # nothing repeats yet
    p.finished(first)  # its output 3..8 joins the global trie, in the host's spare time
    assert p.propose(req([50, 51, 3, 4, 5], uid=4), 4) == []
    assert not p.spare(None)
    other = req([50, 51, 3, 4, 5], uid=2)
    assert p.propose(other, 4) == [6, 7, 8]  # a 3-token match allows 3 drafts
    own = req([20, 21, 22, 23, 24, 20, 21], uid=3)
    assert p.propose(own, 2) == [22, 23]


def test_suffix_long_match_still_drafts_in_full():
    """Copying a long stretch matches as deep as the trie goes (D - 1 tokens), below which a trie
    cut at D holds one token: the draft comes from a shorter match that leaves room for it."""
    p = create_proposer(SpecConfig(method="suffix", max_tree_depth=8))
    text = list(range(100, 120))
    copying = req(text + text[:15], uid=1)
    assert p.propose(copying, 4) == text[15:19]
    p.finished(req([0] + text, uid=2, prompt_len=1))  # the global trie, the same way
    p.spare(None)
    assert p.propose(req([7] + text[:15], uid=3), 4) == text[15:19]


def test_suffix_draft_stops_at_unlikely_continuations():
    p = create_proposer(SpecConfig(method="suffix", min_token_prob=0.6))
    # after "1 2": 3 twice, 4 once, 5 once: 3 has a share of 1/2 < 0.6
    r = req([1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 2, 5, 0, 1, 2])
    assert p.propose(r, 4) == []
    r = req([1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 5, 0, 1, 2], uid=9)
    assert p.propose(r, 4) == [3, 0, 1]  # "0 1 2" then 3 in 3 of 4 cases; a 3-token match


def test_suffix_global_trie_is_bounded():
    p = create_proposer(SpecConfig(method="suffix", max_cached_requests=2))
    for uid in range(5):
        p.finished(req([0, 100 + uid, 7, 8], uid=uid, prompt_len=1))
        while p.spare(2):  # in slices, as between forwards
            pass
    trie = p.shared
    assert len(trie.texts) == 2
    assert set(trie.children[0]) == {103, 104, 7, 8}
    assert trie.count[trie.children[0][7]] == 2
    # the forgotten texts' nodes are free for reuse: the trie holds only the live ones
    assert len(trie.count) - len(trie.free) == 1 + 2 * (3 + 2 + 1) - 3


def test_suffix_trie_reuses_freed_nodes_and_rematches():
    """A request's matched nodes are ids; once the trie forgets a text (its ids then reused),
    they are matched again from the request's last tokens."""
    p = create_proposer(SpecConfig(method="suffix", max_cached_requests=1))
    p.finished(req([0, 1, 2, 3, 4], uid=1, prompt_len=1))
    p.spare(None)
    r = req([9, 1, 2], uid=2)
    assert p.propose(r, 2) == [3, 4]
    p.finished(req([0, 5, 6, 7, 8], uid=3, prompt_len=1))  # forgets 1 2 3 4: its ids are free
    p.spare(None)
    p.finished(req([0, 2, 3, 4, 5, 6], uid=4, prompt_len=1))  # takes them
    p.spare(None)
    r.input_ids.append(3)
    fresh = req(list(r.input_ids), uid=5)
    assert p.propose(r, 2) == p.propose(fresh, 2) == [4, 5]
    assert p.states[r.uid].shared == p.states[fresh.uid].shared


def test_suffix_ahead_nodes_are_taken_once_the_tail_is_accepted():
    """A draft made ahead on a tail not yet accepted: once the tail is accepted the next draft
    starts from the nodes matched then (no second walk over the tail) and equals a fresh
    request's; a tail that was not accepted in full is matched again from the request's tokens."""
    p = create_proposer(SpecConfig(method="suffix", max_tree_depth=8))
    p.finished(req([0, 1, 2, 3, 4, 5, 6, 7, 8], uid=1, prompt_len=1))
    p.spare(None)
    calls = []
    advance = p.shared.advance
    p.shared.advance = lambda nodes, token: calls.append(token) or advance(nodes, token)
    r = req([9, 1, 2], uid=2)
    assert p.propose(r, 2) == [3, 4]
    assert p.propose_ahead(r, [3, 4], 2) == [5, 6]
    calls.clear()
    r.input_ids += [3, 4]
    fresh = req(list(r.input_ids), uid=3)
    assert p.propose(r, 2) == [5, 6]
    assert calls == []  # the tail's nodes were the ahead draft's
    assert p.propose(fresh, 2) == [5, 6]
    assert p.states[r.uid].shared == p.states[fresh.uid].shared
    p.propose_ahead(r, [5, 6], 2)
    r.input_ids += [5, 99]  # the tail's second token rejected
    calls.clear()
    fresh = req(list(r.input_ids), uid=4)
    assert p.propose(r, 2) == p.propose(fresh, 2)
    assert calls[:2] == [5, 99]  # matched again over the accepted tokens
    assert p.states[r.uid].shared == p.states[fresh.uid].shared


def test_adaptive_length_backs_off_and_recovers_through_the_shadow():
    a = Acceptance(4.0)
    assert a.draft_len(4, 0.5) == 4
    for _ in range(4):
        a.record(0, 4)
    assert a.draft_len(4, 0.5) == 0  # not worth it: shadow drafts only
    for _ in range(3):
        a.shadow = [1, 2, 3]
        a.observe([1, 2, 3])
    assert a.draft_len(4, 0.5) >= 3


def test_drafting_ahead_needs_most_recent_verify_steps_to_keep_all():
    """``full`` (the gate of drafting ahead) is the share of about the last eight verify steps
    that kept all their drafts: a request rejecting every other step stays under ``AHEAD_MIN``
    even right after a kept step, one rejecting one step in five stays over it."""
    half, most = Acceptance(4.0), Acceptance(4.0)
    for i in range(64):
        half.record(4 if i % 2 else 1, 4)
        most.record(1 if i % 5 == 4 else 4, 4)
        if i >= 24:
            assert half.full < AHEAD_MIN < most.full


def test_step_cost_is_measured_and_the_plain_step_probed_again():
    cost = StepCost()
    assert cost.ratio == 1.0 and not cost.probe()  # nothing measured: speculation is free
    cost.add(True, 3.0)  # a verify step
    assert cost.probe()  # the plain step was never measured: three plain steps
    cost.add(False, 9.0)  # the first still waited for the verify step: not counted
    assert cost.probe()
    cost.add(False, 1.0)
    assert cost.probe()
    cost.add(False, 1.0)
    assert not cost.probe() and cost.ratio == 3.0
    for _ in range(64):  # speculating all along: the plain step is measured again
        cost.add(True, 3.0)
    assert cost.probe()


def test_vllm_and_sglang_spellings():
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, '
                                      '"prompt_lookup_max": 4, "prompt_lookup_min": 2}')
    assert (config.method, config.num_speculative_tokens, config.prompt_lookup_max) == \
        ("ngram", 4, 4)
    config = parse_args(["--speculative-algorithm", "SUFFIX",
                         "--speculative-num-draft-tokens", "6"]).engine.spec_config()
    assert (config.method, config.num_speculative_tokens) == ("suffix", 5)
    config = parse_args(["--speculative-algorithm", "NEXTN",
                         "--speculative-num-draft-tokens", "4"]).engine.spec_config()
    assert (config.method, config.num_speculative_tokens) == ("mtp", 3)
    config = EngineOptions(speculative_config={"method": "suffix",
                                               "suffix_decoding_max_tree_depth": 16}).spec_config()
    assert config.max_tree_depth == 16
    assert EngineOptions().spec_config() is None


def test_draft_length_defaults_per_method():
    """vLLM's defaults: suffix decoding sizes each draft from its match, so its ceiling is the
    tree's depth (at most 15: 16 rows, a decode graph's size); the other methods draft 4."""
    assert parse_speculative_config('{"method": "ngram"}').num_speculative_tokens == 4
    assert parse_speculative_config('{"method": "suffix"}').num_speculative_tokens == 15
    config = parse_speculative_config('{"method": "suffix", "suffix_decoding_max_tree_depth": 8}')
    assert config.num_speculative_tokens == 8
    config = parse_speculative_config('{"method": "suffix", "num_speculative_tokens": 3}')
    assert config.num_speculative_tokens == 3


@pytest.mark.parametrize("options, message", [
    ({"speculative_config": '{"method": "eagle3"}'}, "needs 'model'"),
    ({"speculative_config": '{"method": "eagle", "model": "x"}'}, "not built"),
    ({"speculative_config": '{"method": "medusa", "num_speculative_tokens": 1}'}, "not built"),
    ({"speculative_config": '{"method": "ngram", "k": 3}'}, "unknown key 'k'"),
    ({"speculative_config": '{"num_speculative_tokens": 3}'}, "'method' is required"),
    ({"speculative_config": "{oops"}, "not valid JSON"),
    ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": 0}'},
     "num_speculative_tokens"),
    ({"speculative_config": '{"method": "suffix", "num_speculative_tokens": 17}'}, "<= 16"),
    ({"speculative_algorithm": "EAGLE3"}, "needs 'model'"),
    ({"speculative_algorithm": "NGRAM", "speculative_draft_model_path": "x"},
     "applies to method 'eagle3'"),
    ({"speculative_draft_model_path": "x"}, "speculative_algorithm"),
    ({"speculative_algorithm": "LOOKAHEAD"}, "speculative_algorithm"),
    ({"speculative_num_draft_tokens": 3}, "speculative_algorithm"),
    ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 1},
     "speculative_num_draft_tokens"),
    ({"speculative_algorithm": "NGRAM", "speculative_config": '{"method": "ngram"}'},
     "not both"),
])
def test_bad_settings_name_their_field(options, message):
    with pytest.raises(ValueError, match=message):
        EngineOptions(**options)


def test_a_tree_of_drafts_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--speculative-algorithm", "NGRAM", "--speculative-eagle-topk", "4"])
    assert "one chain" in capsys.readouterr().err


def test_suffix_learns_from_finished_requests_only_when_asked():
    """A request that ends while the batch is too large to speculate teaches the global trie
    nothing (``SpecDecoder.finished``): inserting its answer costs O(n D) on the host."""
    p = create_proposer(SpecConfig(method="suffix"))
    p.finished(req([1, 2, 3, 4], uid=1, prompt_len=1), learn=False)
    assert not p.spare(None) and not p.shared.texts and not p.shared.children[0]
    p.finished(req([1, 2, 3, 4], uid=2, prompt_len=1))
    p.spare(None)
    assert len(p.shared.texts) == 1
