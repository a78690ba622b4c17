"""``/docs``: the Swagger UI of the API, served from this server.

FastAPI's default page loads Swagger UI's script and style from a CDN, so it is blank on a machine
without internet access (where a local server often runs). The assets come from the
``swagger-ui-py`` package instead (Swagger UI 5, which renders the OpenAPI 3.1 that FastAPI writes),
served under ``/docs/assets``.
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def swagger_ui_dir() -> str:
    import swagger_ui

    return os.path.join(os.path.dirname(swagger_ui.__file__), "static")


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and its assets locally (create the app with ``docs_url=None``)."""
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_dir()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png")
