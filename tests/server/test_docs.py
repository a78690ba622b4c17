"""``/docs`` works offline: its page loads Swagger UI from this server, never from a CDN."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from minisgl.llm.config import EngineOptions
from minisgl.server.app.api_server import create_app
from minisgl.server.config import ServerConfig


def test_docs_page_and_its_assets_are_served_locally():
    config = ServerConfig(model="/models/fake/", engine=EngineOptions(device="cpu"))
    client = TestClient(create_app(config, lambda: None))  # no lifespan: no backend needed
    page = client.get("/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    urls = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text)
    urls += re.findall(r"""url: ['"]([^'"]+)['"]""", page.text)
    assert urls and not [u for u in urls if "//" in u], urls  # nothing from another host
    for url in urls:
        r = client.get(url)
        assert r.status_code == 200 and r.content, url
    assert "/openapi.json" in urls
