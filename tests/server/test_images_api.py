"""Images through every API down to the tokenizer worker (``helpers/image_server.py``: the real
app and tokenizer role, a stand-in scheduler): the openai SDK's chat ``image_url`` parts, the
Responses API's ``input_image``, the anthropic SDK's ``image`` blocks (base64 and url) and
``LLM.chat``'s parts are read, fetched, decoded and preprocessed into the ``UserMsg``'s
``MultimodalPrompt``; every bad image is a 400 naming its field, and the server keeps serving; a
model without a vision tower keeps its text-only 400s. The engine's side is
``tests/engine/test_vision_parity.py``, a real server ``test_vision_server.py``."""

from __future__ import annotations

import base64
import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import httpx
import numpy as np
import openai
import pytest

from helpers.image_server import MODEL, image_server
from helpers.vision_models import make_vision_checkpoint
from minisgl.multimodal.items import ImageItem
from minisgl.multimodal.prompt import MultimodalPrompt


def png(size=(24, 20), seed=0, fmt="PNG") -> bytes:
    """Random pixels; ``seed`` None: one grey (a large image in a small file)."""
    from PIL import Image

    pixels = (np.full((*size, 3), 128, np.uint8) if seed is None else
              np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8))
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


def data_url(blob: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(blob).decode()}"


class Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = png() if self.path == "/cat.png" else b"x" * 50_000 if self.path == "/big" else b""
        self.send_response(200 if body else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def origin():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_vision_checkpoint("qwen3_5", tmp_path_factory.mktemp("vl") / "qwen3_5")


@pytest.fixture(scope="module")
def server(checkpoint):
    with image_server(str(checkpoint), allowed_media_domains=("127.0.0.1",),
                      allow_private_media=True, max_image_bytes=20_000, max_image_pixels=10_000,
                      limit_mm_per_prompt=2, media_fetch_timeout=5.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)


def chat(*parts) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "Describe:"}, *parts]}]


def image_part(url: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    return e.value.body


def sent_images(server) -> MultimodalPrompt:
    """The images of the last prompt the tokenizer worker sent the scheduler."""
    mm = server.worker.sent[-1].mm
    assert mm is not None and mm.input_ids == server.worker.sent[-1].input_ids
    return mm


def test_openai_chat_image_reaches_the_scheduler(server, client):
    blob = png()
    out = client.chat.completions.create(
        model=MODEL, max_tokens=4, messages=chat(image_part(data_url(blob), detail="low")))
    assert out.choices[0].message.content == "ok"
    mm = sent_images(server)
    assert len(mm.images) == 1 and out.usage.prompt_tokens == len(mm.input_ids)
    image = mm.images[0]
    assert mm.input_ids[image.offset:image.end] == [mm.image_token_id] * image.num_tokens
    msg = server.worker.seen[-1]
    assert msg.images == [ImageItem(blob, "messages[0].content[1].image_url")]
    assert msg.messages[0]["content"] == [{"type": "text", "text": "Describe:"},
                                          {"type": "image"}]


def test_two_images_and_a_fetched_one(server, client, origin):
    client.chat.completions.create(
        model=MODEL, max_tokens=4,
        messages=chat(image_part(data_url(png(seed=1))), image_part(f"{origin}/cat.png")))
    first, second = sent_images(server).images
    assert first.digest != second.digest and first.end <= second.offset


def test_responses_input_image(server, client):
    content = [{"type": "input_text", "text": "What is it?"},
               {"type": "input_image", "image_url": data_url(png()), "detail": "auto"}]
    out = client.responses.create(model=MODEL, input=[{"role": "user", "content": content}])
    assert out.output_text == "ok" and len(sent_images(server).images) == 1
    content[1]["image_url"] = data_url(b"garbage")
    err = bad_request(lambda: client.responses.create(
        model=MODEL, input=[{"role": "user", "content": content}]))
    assert err["param"] == "input[0].content[1].image_url"
    assert "not a readable image" in err["message"]


@pytest.mark.parametrize("source", ["base64", "url"])
def test_anthropic_image_blocks(server, origin, source):
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    src = ({"type": "base64", "media_type": "image/png",
            "data": base64.b64encode(png()).decode()} if source == "base64"
           else {"type": "url", "url": f"{origin}/cat.png"})
    content = [{"type": "image", "source": src}, {"type": "text", "text": "What is it?"}]
    out = client.messages.create(model=MODEL, max_tokens=4,
                                 messages=[{"role": "user", "content": content}])
    assert out.content[0].text == "ok" and len(sent_images(server).images) == 1


def test_anthropic_bad_images_name_their_block(server):
    def post(source: dict) -> dict:
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hi"}, {"type": "image", "source": source}]}]}
        r = httpx.post(f"{server.url}/v1/messages", json=body, timeout=30)
        assert r.status_code == 400
        return r.json()["error"]

    err = post({"type": "base64", "media_type": "image/tiff", "data": "AAAA"})
    assert err["message"].startswith("messages[0].content[1].source.media_type: must be one of")
    err = post({"type": "base64", "media_type": "image/png",
                "data": base64.b64encode(png()[:100]).decode()})
    assert err["message"].startswith("messages[0].content[1].source: ")
    assert "corrupt or truncated" in err["message"]
    err = post({"type": "file", "file_id": "f"})
    assert err["message"].startswith("messages[0].content[1].source.type: ")
    err = post({"type": "url", "url": "https://x/y.png", "media_type": "image/png"})
    assert err["message"].startswith("messages[0].content[1].source.media_type: unknown field")


def test_anthropic_count_tokens_counts_images(server, origin):
    """The count is the prompt the tokenizer worker makes for the same request (its images
    expanded by the processor), so it equals the request's usage; a bad image is a 400
    naming its block, as for the request itself."""
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    blob = base64.b64encode(png((40, 56))).decode()
    content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": blob}, "cache_control": {"type": "ephemeral"}},
               {"type": "image", "source": {"type": "url", "url": f"{origin}/cat.png"}},
               {"type": "text", "text": "What differs?"}]
    messages = [{"role": "user", "content": content}]
    out = client.messages.create(model=MODEL, max_tokens=4, system="Be brief.",
                                 messages=messages)
    sent = sent_images(server)
    assert out.usage.input_tokens == len(sent.input_ids) and len(sent.images) == 2
    count = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages)
    assert count.input_tokens == len(sent.input_ids)
    text = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=[
        {"role": "user", "content": "What differs?"}])
    assert count.input_tokens - text.input_tokens >= sum(i.num_tokens for i in sent.images)
    content[0]["source"]["data"] = base64.b64encode(b"garbage").decode()
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.count_tokens(model=MODEL, messages=messages)
    assert e.value.body["error"]["message"].startswith("messages[0].content[0].source: ")


def test_responses_image_fields(server, client):
    part = {"type": "input_image", "image_url": data_url(png()), "detail": "low"}
    text = {"type": "input_text", "text": "What is it?"}
    out = client.responses.create(model=MODEL, input=[{"role": "user", "content": [text, part]}])
    assert out.usage.input_tokens == len(sent_images(server).input_ids)
    for extra, param in [({"detail": "max"}, "detail"), ({"crop": [0, 0]}, "crop")]:
        err = bad_request(lambda: client.responses.create(
            model=MODEL, input=[{"role": "user", "content": [text, {**part, **extra}]}]))
        assert err["param"] == f"input[0].content[1].{param}"


FIELD = "messages[0].content[1].image_url"
BAD = [  # (the image part, the param of the 400, a fragment of its message)
    (image_part(data_url(b"not an image")), FIELD, "not a readable image"),
    (image_part(data_url(png()[:200])), FIELD, "corrupt or truncated"),
    (image_part(data_url(png(fmt="BMP"), "image/bmp")), FIELD, "BMP images are not supported"),
    (image_part(data_url(b"\0" * 30_000)), FIELD, "larger than 20000 bytes"),
    (image_part(data_url(png((200, 60), seed=None))), FIELD,
     "200 pixels, more than the 10000 allowed"),
    (image_part("data:image/png;base64,%%%"), FIELD, "not valid base64"),
    (image_part("file:///etc/passwd"), FIELD, "not 'file'"),
    (image_part(data_url(png()), detail="max"), FIELD + ".detail", "must be one of"),
    (image_part("https://example.com/cat.png"), FIELD, "--allowed-media-domains"),
    (image_part(data_url(png()), uuid="u1"), FIELD + ".uuid", "unknown field"),
    ({**image_part(data_url(png())), "uuid": "u1"}, "messages[0].content[1].uuid",
     "unknown field"),
    ({"type": "input_audio", "input_audio": {}}, "messages[0].content[1].type",
     "'input_audio' are not supported"),
]


@pytest.mark.parametrize("part, param, fragment", BAD)
def test_bad_images_are_400s_naming_the_field(client, part, param, fragment):
    err = bad_request(lambda: client.chat.completions.create(model=MODEL, max_tokens=4,
                                                             messages=chat(part)))
    assert err["param"] == param and fragment in err["message"]


def test_urls_that_fail_and_too_many_images(client, origin):
    for path, fragment in [("/missing.png", "HTTP 404"),
                           ("/big", "50000 bytes, more than the 20000")]:
        err = bad_request(lambda: client.chat.completions.create(
            model=MODEL, max_tokens=4, messages=chat(image_part(f"{origin}{path}"))))
        assert err["param"] == FIELD and fragment in err["message"]
    three = [image_part(data_url(png(seed=i))) for i in range(3)]
    err = bad_request(lambda: client.chat.completions.create(model=MODEL, max_tokens=4,
                                                             messages=chat(*three)))
    assert err["param"] == "messages" and "3 images, more than the 2" in err["message"]


def test_images_only_in_user_messages(client):
    messages = [{"role": "system", "content": [image_part(data_url(png()))]},
                {"role": "user", "content": "hi"}]
    err = bad_request(lambda: client.chat.completions.create(model=MODEL, max_tokens=4,
                                                             messages=messages))
    assert err["param"] == "messages[0].content[0]"


def test_text_still_served_after_bad_images(client):
    out = client.chat.completions.create(model=MODEL, max_tokens=4,
                                         messages=[{"role": "user", "content": "Hi"}])
    assert out.choices[0].message.content == "ok"
    parts = [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]
    out = client.chat.completions.create(model=MODEL, max_tokens=4,
                                         messages=[{"role": "user", "content": parts}])
    assert out.choices[0].message.content == "ok"


def test_a_text_model_keeps_its_400s(tmp_path):
    from helpers.hf_models import make_tiny_checkpoint

    path = str(make_tiny_checkpoint("qwen3", tmp_path / "qwen3"))
    with image_server(path) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
        err = bad_request(lambda: client.chat.completions.create(
            model=MODEL, max_tokens=4, messages=chat(image_part(data_url(png())))))
        assert err["param"] == "messages[0].content"
        assert "only text content parts are supported" in err["message"]
        content = [{"type": "input_image", "image_url": data_url(png())}]
        err = bad_request(lambda: client.responses.create(
            model=MODEL, input=[{"role": "user", "content": content}]))
        assert err["param"] == "input[0].content[0].type"
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]}
        r = httpx.post(f"{srv.url}/v1/messages", json=body, timeout=30)
        assert r.status_code == 400 and "image blocks are not supported" in r.text


def test_llm_chat_parts(checkpoint):
    """``LLM.chat``'s prompt path (``apply_chat_template``) without starting its engine."""
    from minisgl.llm.llm import LLM
    from minisgl.utils.hf import load_tokenizer

    def llm(path) -> LLM:
        out = LLM.__new__(LLM)
        out.model_path, out.tokenizer = str(path), load_tokenizer(str(path))
        return out

    vl = llm(checkpoint)
    mm = vl.apply_chat_template(chat(image_part(data_url(png()))))
    assert isinstance(mm, MultimodalPrompt) and len(mm.images) == 1
    with pytest.raises(ValueError, match="messages\\[0\\].content\\[1\\].image_url: not a"):
        vl.apply_chat_template(chat(image_part(data_url(b"zzz"))))
    with pytest.raises(ValueError, match="--allowed-media-domains"):
        vl.apply_chat_template(chat(image_part("https://example.com/a.png")))
    assert vl.apply_chat_template([{"role": "user", "content": "Hi"}])
