"""An image's encoded bytes from its URL: a base64 ``data:`` URL, or an ``http(s)`` URL fetched
under the server's ``MediaOptions``.

A remote fetch is an open door into the server's network (SSRF), so it is refused unless the
host is on ``--allowed-media-domains``; every address the host resolves to must be public unless
``--allow-private-media``; the connection goes to the address that was checked (a second DNS
answer cannot swap in another); redirects are followed (at most ``MAX_REDIRECTS``) under the same
checks; the whole fetch has one deadline and stops reading past ``max_image_bytes``.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import ipaddress
import re
import socket
import time
import urllib.parse

from .config import MediaOptions
from .items import ImageItem, ImageRef, MediaError

MAX_REDIRECTS = 3
_CHUNK = 1 << 16
_WHITESPACE = re.compile(rb"\s+")


def load_image(ref: ImageRef, opts: MediaOptions) -> ImageItem:
    """The bytes of ``ref`` (blocking: the API server runs it in a thread)."""
    if ref.url.startswith("data:"):
        return ImageItem(data_url_bytes(ref.url, ref.field, opts.max_image_bytes), ref.field)
    return ImageItem(fetch(ref.url, ref.field, opts), ref.field)


def data_url_bytes(url: str, field: str, max_bytes: int) -> bytes:
    """``data:[<media type>][;base64],<data>``: base64 only, an image media type if one is
    given."""
    head, comma, data = url.partition(",")
    params = head[len("data:"):].split(";")
    if not comma or "base64" not in params[1:]:
        raise MediaError(field, "a data URL must be base64 (data:image/png;base64,...)")
    if params[0] and not params[0].lower().startswith("image/"):
        raise MediaError(field, f"a data URL of {params[0]!r} is not an image")
    raw = _WHITESPACE.sub(b"", data.encode("ascii", "replace"))
    if len(raw) * 3 // 4 > max_bytes + 2:
        raise MediaError(field, f"the image is larger than {max_bytes} bytes")
    try:
        out = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(field, "the data URL is not valid base64") from None
    if len(out) > max_bytes:
        raise MediaError(field, f"the image is {len(out)} bytes, more than the {max_bytes} "
                         "allowed")
    if not out:
        raise MediaError(field, "the data URL holds no bytes")
    return out


def fetch(url: str, field: str, opts: MediaOptions) -> bytes:
    deadline = time.monotonic() + opts.media_fetch_timeout
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise MediaError(field, f"cannot fetch {_short(url)!r}: not an http(s) URL")
        host = parts.hostname
        if not opts.allows_host(host):
            raise MediaError(field, f"image URLs of {host!r} are not fetched (the server's "
                             "--allowed-media-domains does not list it)")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = _checked_address(host, port, field, opts.allow_private_media)
        status, location, body = _get(parts, address, port, deadline, field, opts)
        if status in (301, 302, 303, 307, 308) and location:
            url = urllib.parse.urljoin(url, location)
            continue
        if status != 200:
            raise MediaError(field, f"fetching the image failed: HTTP {status}")
        return body
    raise MediaError(field, f"fetching the image failed: more than {MAX_REDIRECTS} redirects")


def _checked_address(host: str, port: int, field: str, allow_private: bool) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise MediaError(field, f"fetching the image failed: cannot resolve {host!r} "
                         f"({e})") from None
    addresses = [info[4][0] for info in infos]
    if not allow_private:
        for address in addresses:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
            if ip.version == 6 and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            if not ip.is_global or ip.is_multicast:
                raise MediaError(field, f"{host!r} resolves to the non-public address {ip}: "
                                 "not fetched (--allow-private-media)")
    return addresses[0]


def _get(parts: urllib.parse.SplitResult, address: str, port: int, deadline: float, field: str,
         opts: MediaOptions) -> tuple[int, str | None, bytes]:
    """One GET to the checked ``address``, TLS verified against the URL's host name."""
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, port, timeout=_left(deadline, field, opts))
    sockets: list[socket.socket] = []  # the response may own the socket: keep it for timeouts

    def connect(_addr, timeout=None, source=None) -> socket.socket:  # the checked address
        sockets.append(socket.create_connection((address, port), timeout))
        return sockets[-1]

    conn._create_connection = connect  # type: ignore[attr-defined]
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    try:
        conn.request("GET", path, headers={"User-Agent": "minisgl", "Accept": "image/*"})
        resp = conn.getresponse()
        if resp.status != 200:
            return resp.status, resp.getheader("Location"), b""
        size = resp.getheader("Content-Length")
        if size and size.isdigit() and int(size) > opts.max_image_bytes:
            raise MediaError(field, f"the image is {size} bytes, more than the "
                             f"{opts.max_image_bytes} allowed")
        body = bytearray()
        while chunk := _read(sockets[-1], resp, deadline, field, opts):
            body += chunk
            if len(body) > opts.max_image_bytes:
                raise MediaError(field, f"the image is more than {opts.max_image_bytes} bytes")
        return 200, None, bytes(body)
    except (socket.timeout, TimeoutError):
        raise _timed_out(field, opts) from None
    except (OSError, http.client.HTTPException) as e:
        raise MediaError(field, f"fetching the image failed: {type(e).__name__}: {e}") from None
    finally:
        conn.close()


def _read(sock: socket.socket, resp, deadline: float, field: str, opts: MediaOptions) -> bytes:
    sock.settimeout(_left(deadline, field, opts))
    return resp.read1(_CHUNK)


def _left(deadline: float, field: str, opts: MediaOptions) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise _timed_out(field, opts)
    return left


def _timed_out(field: str, opts: MediaOptions) -> MediaError:
    return MediaError(field, f"fetching the image timed out ({opts.media_fetch_timeout:g} s)")


def _short(url: str) -> str:
    return url if len(url) <= 80 else url[:77] + "..."
