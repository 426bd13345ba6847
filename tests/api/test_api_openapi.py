"""The OpenAPI document describes exactly the app's routes, and its Job schema exactly a public row."""

from __future__ import annotations

import re
from typing import Any

from api_support import Harness
from werkzeug.routing import Rule

from supervisor._app import PUBLIC_ENDPOINTS
from supervisor._openapi import openapi_document

HTTP_METHODS = {"get", "post", "put", "patch", "delete"}


def openapi_path(rule: Rule) -> str:
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in HTTP_METHODS
    }


def app_routes(harness: Harness) -> dict[tuple[str, str], Rule]:
    return {
        (method, openapi_path(rule)): rule
        for rule in harness.app.url_map.iter_rules()
        for method in (rule.methods or set()) - {"HEAD", "OPTIONS"}
    }


async def test_the_document_lists_every_route_and_nothing_else(harness: Harness) -> None:
    assert set(operations(openapi_document())) == set(app_routes(harness))


async def test_path_parameters_match_the_route_arguments(harness: Harness) -> None:
    ops = operations(openapi_document())
    for key, rule in app_routes(harness).items():
        documented = {p["name"] for p in ops[key].get("parameters", []) if p["in"] == "path"}
        assert documented == set(rule.arguments), key


async def test_security_follows_the_public_endpoints(harness: Harness) -> None:
    doc = openapi_document()
    assert doc["security"] == [{"apiToken": []}]
    ops = operations(doc)
    for key, rule in app_routes(harness).items():
        if rule.endpoint in PUBLIC_ENDPOINTS:
            assert "security" in ops[key] and ops[key]["security"] != doc["security"], key
        else:
            assert "security" not in ops[key], key  # inherits the API token
            assert "401" in ops[key]["responses"], key


async def test_every_operation_is_described_and_every_view_has_a_docstring(harness: Harness) -> None:
    ops = operations(openapi_document())
    assert len({op["operationId"] for op in ops.values()}) == len(ops)
    for op in ops.values():
        assert op["summary"] and op["responses"]
    for endpoint, view in harness.app.view_functions.items():
        assert view.__doc__ and "\n" not in view.__doc__.strip(), endpoint


def test_every_ref_resolves() -> None:
    doc = openapi_document()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                _, _, kind, name = node["$ref"].split("/")
                assert name in doc["components"][kind], node["$ref"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)


async def test_the_job_schema_is_a_public_row(harness: Harness) -> None:
    await harness.supervisor.pause()
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "tidy"})
    _, row = await harness.json("GET", f"/api/jobs/{answer['job_id']}")  # queued: carries queue_position too
    schema = openapi_document()["components"]["schemas"]["Job"]
    assert set(schema["properties"]) == set(row)


async def test_the_document_is_served(harness: Harness) -> None:
    status, body = await harness.json("GET", "/api/openapi.json")
    assert status == 200
    assert body == openapi_document()
    assert body["openapi"].startswith("3.1")
