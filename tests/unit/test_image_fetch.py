"""Image URLs (``minisgl.multimodal.fetch``): data URLs, and ``http`` URLs fetched from a local
server under the allow-list, the private-address rule, the deadline and the byte cap; every
failure a ``MediaError`` naming the field."""

from __future__ import annotations

import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from minisgl.multimodal.config import MediaOptions, parse_mm_limit
from minisgl.multimodal.fetch import data_url_bytes, load_image
from minisgl.multimodal.items import ImageRef, MediaError, check_count, image_ref

FIELD = "messages[0].content[1].image_url"
BODY = b"\x89PNG fake image bytes" * 10


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        route = self.path.split("?")[0]
        if route == "/img":
            self._send(200, BODY)
        elif route == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            for b in BODY:  # a byte at a time, too slowly for the deadline
                self.wfile.write(bytes([b]))
                self.wfile.flush()
                time.sleep(0.05)
        elif route == "/big":
            self._send(200, b"x" * 5000)
        elif route == "/big-unannounced":  # no Content-Length: the cap applies while reading
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * 5000)
        elif route == "/redirect":
            self._send(302, b"", location="/img")
        elif route == "/loop":
            self._send(302, b"", location="/loop")
        elif route == "/away":
            self._send(302, b"", location="http://elsewhere.invalid/img")
        else:
            self._send(404, b"missing")

    def _send(self, status: int, body: bytes, location: str | None = None) -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hung up on a slow or large answer (as the fetcher does)


@pytest.fixture(scope="module")
def origin():
    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


LOCAL = MediaOptions(allowed_media_domains=("127.0.0.1",), allow_private_media=True,
                     media_fetch_timeout=2.0, max_image_bytes=4096)


def get(url: str, opts: MediaOptions = LOCAL) -> bytes:
    return load_image(ImageRef(url, FIELD), opts).data


def refused(url: str, fragment: str, opts: MediaOptions = LOCAL) -> None:
    with pytest.raises(MediaError, match=fragment) as e:
        get(url, opts)
    assert e.value.param == FIELD


def test_fetches_and_follows_a_redirect(origin):
    assert get(f"{origin}/img") == BODY
    assert get(f"{origin}/redirect") == BODY


def test_hosts_off_the_allow_list_are_not_fetched(origin):
    refused(f"{origin}/img", "not fetched .*--allowed-media-domains",
            MediaOptions(allow_private_media=True))  # default: no host at all
    refused(f"{origin}/away", "'elsewhere.invalid' are not fetched")


def test_private_addresses_need_their_own_opt_in(origin):
    listed = MediaOptions(allowed_media_domains=("127.0.0.1", "localhost"))
    refused(f"{origin}/img", "non-public address 127.0.0.1", listed)
    port = origin.rsplit(":", 1)[1]
    refused(f"http://localhost:{port}/img", "non-public address", listed)
    any_host = MediaOptions(allowed_media_domains=("*",))
    refused("http://10.1.2.3/img", "non-public address 10.1.2.3", any_host)
    refused("http://[::1]/img", "non-public address ::1", any_host)
    refused("http://169.254.169.254/latest/meta-data", "non-public", any_host)


def test_slow_large_and_failing_urls(origin):
    start = time.monotonic()
    refused(f"{origin}/slow", r"timed out \(1 s\)",
            MediaOptions(allowed_media_domains=("127.0.0.1",), allow_private_media=True,
                         media_fetch_timeout=1.0))
    assert time.monotonic() - start < 3
    refused(f"{origin}/big", "5000 bytes, more than the 4096 allowed")
    refused(f"{origin}/big-unannounced", "more than 4096 bytes")
    refused(f"{origin}/nothing", "HTTP 404")
    refused(f"{origin}/loop", "more than 3 redirects")
    refused("http://127.0.0.1:1/img", "fetching the image failed: ConnectionRefusedError")


def test_data_urls():
    png = base64.b64encode(BODY).decode()
    assert data_url_bytes(f"data:image/png;base64,{png}", FIELD, 4096) == BODY
    assert data_url_bytes(f"data:;base64,{png[:40]}\n{png[40:]}", FIELD, 4096) == BODY
    for url, fragment in [
        (f"data:image/png,{png}", "must be base64"),
        (f"data:text/plain;base64,{png}", "'text/plain' is not an image"),
        ("data:image/png;base64,@@@@", "not valid base64"),
        ("data:image/png;base64,", "holds no bytes"),
        (f"data:image/png;base64,{base64.b64encode(b'x' * 5000).decode()}", "larger than 4096"),
    ]:
        with pytest.raises(MediaError, match=fragment) as e:
            data_url_bytes(url, FIELD, 4096)
        assert e.value.param == FIELD


def test_refs_and_counts():
    assert image_ref("https://x/y.png", FIELD, "low").detail == "low"
    for url, fragment in [("ftp://x/y", "not 'ftp'"), ("", "must be a data URL"),
                          (None, "must be a data URL"), ("/etc/passwd", "not 'no scheme'")]:
        with pytest.raises(MediaError, match=fragment):
            image_ref(url, FIELD)
    with pytest.raises(MediaError, match="detail: must be one of auto, low, high") as e:
        image_ref("https://x/y.png", FIELD, "ultra")
    assert e.value.param == FIELD + ".detail"
    refs = [ImageRef("data:,", FIELD)] * 3
    check_count(refs, 3)
    with pytest.raises(MediaError, match="3 images, more than the 2") as e:
        check_count(refs, 2)
    assert e.value.param == "messages"


def test_limit_flag_takes_vllm_json():
    assert parse_mm_limit("4") == 4
    assert parse_mm_limit('{"image": 2, "video": 0}') == 2
    with pytest.raises(ValueError, match="only images are served, not video"):
        parse_mm_limit('{"image": 2, "video": 1}')
