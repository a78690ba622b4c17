"""``/openapi.json`` is part of what a user sees: clients and routers are generated from it, so a
change to it is deliberate. The live schema is compared with the one saved in
``data/openapi_schema.json`` (normalised JSON: sorted keys, fixed indent), with and without an API
key (the key adds the bearer scheme). After a deliberate change, refresh the file with
``python tests/server/test_openapi_snapshot.py`` and commit it with the change."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from minisgl.llm.config import EngineOptions
from minisgl.server.app.api_server import create_app
from minisgl.server.config import ServerConfig

SAVED = Path(__file__).resolve().parent / "data" / "openapi_schema.json"


def live_schemas() -> dict:
    schemas = {}
    for name, key in (("with_api_key", "secret"), ("without_api_key", None)):
        config = ServerConfig(model="/models/fake/", api_key=key,
                              engine=EngineOptions(device="cpu"))
        client = TestClient(create_app(config, lambda: None))  # no lifespan: no backend needed
        schemas[name] = client.get("/openapi.json").json()
    return schemas


def normalised(data: dict) -> str:
    return json.dumps(data, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def test_openapi_schema_is_the_saved_one():
    assert normalised(live_schemas()) == SAVED.read_text(encoding="utf-8"), (
        "/openapi.json changed; if on purpose, run this file to refresh the saved schema")


if __name__ == "__main__":
    SAVED.write_text(normalised(live_schemas()), encoding="utf-8")
    sys.exit(0)


def test_operation_ids_are_unique():
    """A duplicate makes FastAPI warn, and a client generator name two methods alike."""
    for schema in live_schemas().values():
        ids = [op["operationId"] for item in schema["paths"].values() for op in item.values()]
        assert len(ids) == len(set(ids))
