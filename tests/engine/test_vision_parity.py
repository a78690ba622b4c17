"""Chats with images through the real engine (``LLM``: scheduler, vision tower, KV cache, torch
attention), float32 on CPU, against transformers' multimodal models (``helpers/vision_reference``)
for tiny random Qwen3.5 (and Qwen3.5-MoE), Gemma 3 and Gemma 4 checkpoints: identical greedy
tokens and every step's logits within 1e-3 of their spread, with one image and with two, two
requests with different images in one step (one batched tower call), a prefill chunk boundary
inside an image (Qwen: the chunks take the image's rows by position; Gemma: the scheduler keeps
an image in one chunk, since its tokens attend to each other both ways), and the prefix cache
keyed by the image's content (a repeated image is a hit and is not encoded again; another image
is not), and TP=2."""

from __future__ import annotations

import pytest
import torch

from helpers.device import TEST_DEVICE
from helpers.engine_utils import record_sampled_logits
from helpers.vision_models import make_vision_checkpoint
from helpers.vision_reference import chat, hf_vision_greedy, random_image
from minisgl import LLM, SamplingParams

pytestmark = pytest.mark.any_device  # MINISGL_TEST_DEVICE=cuda: the Triton backend, float32
ARCHS = ("qwen3_5", "gemma3", "gemma4")
NEW_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
ATOL = 1e-2 if TEST_DEVICE == "cuda" else 1e-3  # CUDA: as test_hybrid_parity (TF32 in fla)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("vlm")
    return {arch: str(make_vision_checkpoint(arch, root / arch))
            for arch in (*ARCHS, "qwen3_5_moe")}


@pytest.fixture(scope="module")
def images():
    return [random_image(32, 48, seed=1), random_image(40, 28, seed=2)]


def make_llm(path: str, **options) -> LLM:
    return LLM(path, device=TEST_DEVICE, dtype="float32", num_pages=2048, **options)


def check_against_transformers(llm: LLM, path: str, arch: str, conversations, images_of):
    """Run the conversations in one ``generate`` call; each must give transformers' tokens
    and logits."""
    prompts = [llm.apply_chat_template(c) for c in conversations]
    recorded = record_sampled_logits(llm.scheduler.engine)
    first = llm._next_uid
    outputs = llm.generate(prompts, GREEDY)
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        tokens, logits = hf_vision_greedy(path, arch, prompt.input_ids, images_of[i], NEW_TOKENS)
        assert out.token_ids == tokens
        # 1e-3 of the logits' spread, as test_hybrid_parity (float32 rounding that the hybrid
        # MoE's near-tied routes amplify)
        atol = ATOL * max(1.0, float(logits.std()))
        torch.testing.assert_close(torch.stack(recorded[first + i]).cpu(), logits, atol=atol,
                                   rtol=0)
    llm.scheduler.check_integrity()
    return prompts, outputs


@pytest.mark.slow
@pytest.mark.parametrize("arch", [*ARCHS, "qwen3_5_moe"])
def test_one_and_two_images_match_transformers(arch, checkpoints, images):
    """One request with one image and one with two, prefilled in the same step."""
    llm = make_llm(checkpoints[arch])
    check_against_transformers(llm, checkpoints[arch], arch,
                               [chat(images[:1]), chat(images, text="and these?")],
                               [images[:1], images])
    assert llm.scheduler.engine.images.kept == {}  # every image consumed and freed
    llm.close()


def _chunks(llm: LLM) -> list[tuple[int, int, object, bool]]:
    """From now on, every prefill chunk the engine prepares: (start, end, its request, whether
    decode rows share its step)."""
    seen: list[tuple[int, int, object, bool]] = []
    engine = llm.scheduler.engine
    prepare = engine.prepare

    def spy(batch):
        prefill = batch.feeds[batch.num_decode_rows:]
        mixed = batch.num_decode_rows > 0
        seen.extend((f.cached_len, f.device_len, f.req, mixed) for f in prefill)
        return prepare(batch)

    engine.prepare = spy
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_chunked_prefill_through_an_image(arch, checkpoints, images):
    """Chunks of 7 tokens: Qwen's cut through the image (its rows go by position); Gemma's
    never end inside one (the first chunk of a step runs to the image's end). The second
    request's chunks share their steps with the first one's decode rows (mixed steps)."""
    llm = make_llm(checkpoints[arch], max_prefill_tokens=7)
    chunks = _chunks(llm)
    prompts, _ = check_against_transformers(
        llm, checkpoints[arch], arch, [chat(images[:1]), chat(images[1:], text="and?")],
        [images[:1], images[1:]])
    assert any(mixed for *_, mixed in chunks)
    cut = [end for _, end, req, _ in chunks for image in req.mm.images
           if image.offset < end < image.end]
    if arch.startswith("qwen"):
        assert cut, "no chunk ended inside an image"
    else:
        assert not cut and any(end - start > 7 for start, end, *_ in chunks)
    llm.close()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gemma3", "gemma4"])
def test_images_with_the_sliding_layers_own_pool(arch, checkpoints, images):
    """A model whose images attend both ways runs a chunk on to an image's end past the step
    budget, which the default's sizing does not bound: ``auto`` keeps one pool for it. A ratio
    gives the sliding layers their own pool, and an image longer than the window, attending
    both ways inside one chunk, still gives transformers' tokens."""
    path = checkpoints[arch]
    assert make_llm(path, max_running_requests=4).scheduler.engine.window_pages is None
    llm = make_llm(path, max_running_requests=4, max_prefill_tokens=7, sliding_pool_ratio=0.1)
    assert llm.scheduler.engine.window_pages is not None
    check_against_transformers(llm, path, arch,
                               [chat(images[:1]), chat(images, text="and these?")],
                               [images[:1], images])
    llm.close()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gemma3", "qwen3_5"])
def test_prefix_cache_keys_images_by_content(arch, checkpoints, images):
    """A conversation's next turn with the same image resumes after the whole first prompt and
    does not run the tower again; the same turn with another image stops at that image (and
    answers as transformers does for it)."""
    path = checkpoints[arch]
    llm = make_llm(path)
    cache, encoder = llm.scheduler.cache, llm.scheduler.engine.images
    first = llm.apply_chat_template(chat(images[:1]))
    answer = llm.generate([first], GREEDY)[0]
    turn = chat(images[:1]) + [{"role": "assistant", "content": "It is noise."},
                               {"role": "user", "content": "Sure?"}]
    second = llm.apply_chat_template(turn)
    assert second.input_ids[:len(first.input_ids)] == first.input_ids
    encoded, hits = encoder.num_encoded, cache.num_hit_tokens
    check_against_transformers(llm, path, arch, [turn], [images[:1]])
    assert cache.num_hit_tokens - hits >= len(first.input_ids) - 1
    assert encoder.num_encoded == encoded  # the image's KV came from the cache
    other = chat(images[1:]) + turn[1:]
    hits = cache.num_hit_tokens
    prompts, outputs = check_against_transformers(llm, path, arch, [other], [images[1:]])
    assert cache.num_hit_tokens - hits <= prompts[0].images[0].offset
    assert encoder.num_encoded == encoded + 1
    assert outputs[0].token_ids != answer.token_ids or arch == "gemma3"  # a tiny Gemma repeats
    llm.close()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3_5", "gemma3"])
def test_tensor_parallel(arch, checkpoints, images):
    """TP=2 (gloo): every rank gets the request's images in the broadcast message, runs its own
    replica of the tower and swaps its embedding rows: transformers' tokens."""
    if TEST_DEVICE == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    llm = make_llm(checkpoints[arch], tp=2)
    prompts = [llm.apply_chat_template(chat(images))]
    out = llm.generate(prompts, GREEDY)[0]
    tokens, _ = hf_vision_greedy(checkpoints[arch], arch, prompts[0].input_ids, images,
                                 NEW_TOKENS)
    assert out.token_ids == tokens
    llm.close()


@pytest.mark.gpu
def test_decode_graphs_with_images(checkpoints, images):
    """A Qwen request with images decodes through the CUDA graphs (each row's M-RoPE delta a
    shift of its 1-D position: ``engine/graph.py``), beside a text request and a request with
    another image in the same batch: the greedy tokens of the eager run (no graphs), which the
    tests above hold to transformers'."""
    path = checkpoints["qwen3_5"]
    conversations = [chat(images[:1]), [{"role": "user", "content": "Say something."}],
                     chat(images[1:], text="and this?")]
    outputs = {}
    for graphs in (True, False):
        llm = make_llm(path, **({} if graphs else {"cuda_graph_max_bs": 0}))
        engine = llm.scheduler.engine
        assert (engine.graph_runner is not None) == graphs
        replays = []
        if graphs:
            replay = engine.graph_runner.replay

            def recorded(batch, greedy, shifts=None, replay=replay):
                replays.append(shifts)
                return replay(batch, greedy, shifts)

            engine.graph_runner.replay = recorded
        prompts = [llm.apply_chat_template(c) for c in conversations]
        outputs[graphs] = [o.token_ids for o in llm.generate(prompts, GREEDY)]
        if graphs:  # the decode steps of the image requests replayed graphs, with their deltas
            assert any(s is not None and any(s) for s in replays)
        llm.close()
    assert outputs[True] == outputs[False]
