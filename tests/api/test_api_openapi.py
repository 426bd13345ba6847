"""The OpenAPI document describes exactly the app's routes, its Job schema exactly a public row, and its value rules
exactly what the server accepts (ADR 0015): a value the document calls valid is accepted, one it calls invalid is
refused. The fuzz test (test_api_fuzz.py) holds the server to the same document with generated requests."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

import jsonschema_rs
import pytest
from api_support import Harness, wait_log_line
from werkzeug.routing import Rule

from supervisor.api import JOBS_SUBROUTES, PUBLIC_ENDPOINTS, SCOPE_OF, openapi_document
from supervisor.domain import JobKind, KindCatalog, load_kinds

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
    assert set(operations(openapi_document(harness.supervisor.kinds))) == set(app_routes(harness))


async def test_path_parameters_match_the_route_arguments(harness: Harness) -> None:
    ops = operations(openapi_document(harness.supervisor.kinds))
    for key, rule in app_routes(harness).items():
        documented = {p["name"] for p in ops[key].get("parameters", []) if p["in"] == "path"}
        assert documented == set(rule.arguments), key


async def test_security_follows_the_public_endpoints(harness: Harness) -> None:
    doc = openapi_document(harness.supervisor.kinds)
    assert doc["security"] == [{"apiToken": []}]
    ops = operations(doc)
    for key, rule in app_routes(harness).items():
        if rule.endpoint in PUBLIC_ENDPOINTS:
            assert "security" in ops[key] and ops[key]["security"] != doc["security"], key
        else:
            # The API token, with the scope the route needs (ADR 0017); a scope above read may be refused (403).
            scope = SCOPE_OF[rule.endpoint]
            assert ops[key]["security"] == [{"apiToken": [scope]}], key
            assert "401" in ops[key]["responses"], key
            assert ("insufficient_scope" in ops[key]["responses"].get("403", {}).get("description", "")) == (
                scope != "read"
            ), key


async def test_every_operation_is_described_and_every_view_has_a_docstring(harness: Harness) -> None:
    ops = operations(openapi_document(harness.supervisor.kinds))
    assert len({op["operationId"] for op in ops.values()}) == len(ops)
    for op in ops.values():
        assert op["summary"] and op["responses"]
    for endpoint, view in harness.app.view_functions.items():
        assert view.__doc__ and "\n" not in view.__doc__.strip(), endpoint


def test_every_ref_resolves() -> None:
    doc = openapi_document(load_kinds(None))

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
    schema = openapi_document(harness.supervisor.kinds)["components"]["schemas"]["Job"]
    assert set(schema["properties"]) == set(row)


async def test_the_document_is_served(harness: Harness) -> None:
    status, body = await harness.json("GET", "/api/openapi.json")
    assert status == 200
    assert body == openapi_document(harness.supervisor.kinds)
    assert body["openapi"].startswith("3.1")


# -- the document's value rules are the server's -------------------------------------------------------------


def parameter_schema(doc: dict[str, Any], operation_id: str, name: str) -> dict[str, Any]:
    op = next(op for op in operations(doc).values() if op["operationId"] == operation_id)
    return next(p["schema"] for p in op["parameters"] if p["name"] == name)


def doc_accepts(schema: dict[str, Any], value: Any, doc: dict[str, Any] | None = None) -> bool:
    # Draft 2020-12 is OpenAPI 3.1's dialect; patterns are ECMA regexes there, as in every OpenAPI tool. With ``doc``,
    # the schema's references (#/components/schemas/...) resolve in it.
    if doc is not None:
        schema = {**schema, "components": doc["components"]}
    return bool(jsonschema_rs.Draft202012Validator(schema).is_valid(value))


def schema_of(doc: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """The component a ``{"$ref": "#/components/schemas/NAME"}`` names."""
    name = reference["$ref"].removeprefix("#/components/schemas/")
    schema: dict[str, Any] = doc["components"]["schemas"][name]
    return schema


def enqueue_bodies(doc: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each kind's enqueue body and its params' schema, by kind (each a component of its own)."""
    out = {}
    for reference in doc["components"]["schemas"]["EnqueueRequest"]["oneOf"]:
        body = schema_of(doc, reference)
        params = body["properties"]["params"]
        out[body["properties"]["kind"]["const"]] = (body, schema_of(doc, params.get("oneOf", [params])[0]))
    return out


def test_the_enqueue_body_is_one_schema_per_kind_with_exactly_its_params() -> None:
    kinds: KindCatalog = load_kinds(None)
    by_kind = enqueue_bodies(openapi_document(kinds))
    assert sorted(by_kind) == kinds.names()
    for name, (_, params) in by_kind.items():
        declared = kinds.get(name).params
        assert set(params["properties"]) == set(declared), name
        assert params["additionalProperties"] is False


async def test_a_param_with_a_default_is_not_required_and_shows_its_default(harness: Harness) -> None:
    doc = openapi_document(harness.supervisor.kinds)
    by_kind = enqueue_bodies(doc)
    (paged, paged_params), (knobs, knobs_params) = by_kind["paged"], by_kind["knobs"]
    assert paged["required"] == ["kind", "params"]
    assert paged_params["required"] == ["feed"]
    assert paged_params["properties"]["limit"]["default"] == 0
    assert "default" not in paged_params["properties"]["feed"]
    # A kind whose every param has a default may be enqueued without params, as one that has none.
    assert knobs["required"] == ["kind"]
    assert knobs_params["required"] == []
    assert {"type": "null"} in knobs["properties"]["params"]["oneOf"]
    for params in ({}, None):
        assert doc_accepts(knobs, {"kind": "knobs", "params": params}, doc)
    defaults = {name: prop["default"] for name, prop in knobs_params["properties"].items()}
    assert defaults == {"ratio": 0.5, "flag": True}
    # Each default is valid by its own schema.
    assert doc_accepts(knobs_params["properties"]["ratio"], 0.5)


async def test_the_built_in_pipeline_documents_max_episodes_as_optional() -> None:
    _, pipeline = enqueue_bodies(openapi_document(load_kinds(None)))["pipeline"]
    assert pipeline["required"] == ["feed"]
    assert pipeline["properties"]["max_episodes"]["default"] == 0


def test_every_schema_is_named_once_and_no_two_names_make_one_class() -> None:
    """A client generator names a model by its schema's name, whatever its case and separators: kinds whose names
    differ only so (``my-kind``, ``my_kind``, ``My_Kind``), or that spell another schema's name, each get their own."""
    kinds = KindCatalog({name: JobKind(name=name, argv=("true",)) for name in ("my-kind", "my_kind", "My_Kind", "Job")})
    doc = openapi_document(kinds)
    names = list(doc["components"]["schemas"])
    folded = [name.replace("_", "").replace("-", "").lower() for name in names]
    assert len(set(folded)) == len(folded), names
    assert sorted(enqueue_bodies(doc)) == ["Job", "My_Kind", "my-kind", "my_kind"]
    assert all("title" not in schema for schema in doc["components"]["schemas"].values())


# (body, valid?) - each valid one is accepted (202), each invalid one refused (422); the queue is paused.
ENQUEUE_CASES: list[tuple[dict[str, Any], bool]] = [
    ({"kind": "tidy"}, True),
    ({"kind": "tidy", "params": None}, True),
    ({"kind": "tidy", "params": {}}, True),
    ({"kind": "tidy", "params": {"extra": 1}}, False),
    ({"kind": "no-such-kind"}, False),
    ({"kind": ""}, False),
    ({"kind": 3}, False),
    ({"params": {}}, False),
    ({"kind": "sleep"}, False),
    ({"kind": "sleep", "params": {}}, False),
    ({"kind": "sleep", "params": {"seconds": 0.5}}, True),
    ({"kind": "sleep", "params": {"seconds": "0.5"}}, True),
    ({"kind": "sleep", "params": {"seconds": "1e3"}}, True),
    ({"kind": "sleep", "params": {"seconds": ".5"}}, True),
    ({"kind": "sleep", "params": {"seconds": "nan"}}, False),
    ({"kind": "sleep", "params": {"seconds": " 1"}}, False),
    ({"kind": "sleep", "params": {"seconds": "1_0"}}, False),
    ({"kind": "sleep", "params": {"seconds": "\u0661"}}, False),
    ({"kind": "sleep", "params": {"seconds": True}}, False),
    # Every float the pattern admits is finite (the fuzzer sent "2717671258812610e880": inf, refused);
    # a JSON integer past the largest float used to answer 500.
    ({"kind": "sleep", "params": {"seconds": "1e999"}}, False),
    ({"kind": "sleep", "params": {"seconds": "2717671258812610e880"}}, False),
    ({"kind": "sleep", "params": {"seconds": "99999999999999999999.99999999999999999999e99"}}, True),
    ({"kind": "sleep", "params": {"seconds": 10**400}}, False),
    ({"kind": "sleep", "params": {"seconds": -(10**400)}}, False),
    ({"kind": "sleep", "params": {"seconds": 1.7976931348623157e308}}, True),
    ({"kind": "beater", "params": {"units": 3}}, True),
    ({"kind": "beater", "params": {"units": "-3"}}, True),
    ({"kind": "beater", "params": {"units": "3.0"}}, False),
    ({"kind": "beater", "params": {"units": "\u0661"}}, False),
    ({"kind": "beater", "params": {"units": "1" * 19}}, False),
    ({"kind": "typed", "params": {"n": 1, "ratio": 1, "flag": "TRUE", "name": ""}}, True),
    ({"kind": "typed", "params": {"n": 1, "ratio": 1, "flag": "yes", "name": "x"}}, False),
    ({"kind": "typed", "params": {"n": 1, "ratio": 1, "flag": False, "name": "-x"}}, False),
    ({"kind": "typed", "params": {"n": 1, "ratio": 1, "flag": False, "name": "a\x00b"}}, False),
    ({"kind": "typed", "params": {"n": 1, "ratio": 1, "flag": False, "name": "x" * 4097}}, False),
    ({"kind": "typed", "params": {"n": 1, "ratio": 1, "flag": False, "name": "\u00e9t\u00e9 x-1"}}, True),
    # A param with a default may be omitted; when given, it is checked as any other.
    ({"kind": "paged", "params": {"feed": "a"}}, True),
    ({"kind": "paged", "params": {"feed": "a", "limit": 5}}, True),
    ({"kind": "paged", "params": {"feed": "a", "limit": "5"}}, True),
    ({"kind": "paged", "params": {"feed": "a", "limit": "five"}}, False),
    ({"kind": "paged", "params": {"feed": "a", "limit": None}}, False),
    ({"kind": "paged", "params": {"limit": 5}}, False),
    ({"kind": "paged", "params": {}}, False),
    ({"kind": "paged"}, False),
    ({"kind": "knobs"}, True),
    ({"kind": "knobs", "params": None}, True),
    ({"kind": "knobs", "params": {}}, True),
    ({"kind": "knobs", "params": {"flag": "false"}}, True),
    ({"kind": "knobs", "params": {"flag": "no"}}, False),
    ({"kind": "knobs", "params": {"extra": 1}}, False),
]


@pytest.mark.parametrize(("body", "valid"), ENQUEUE_CASES, ids=[json.dumps(c[0])[:60] for c in ENQUEUE_CASES])
async def test_an_enqueue_body_is_accepted_exactly_when_the_document_says_it_is_valid(
    harness: Harness, body: dict[str, Any], valid: bool
) -> None:
    await harness.supervisor.pause()
    doc = openapi_document(harness.supervisor.kinds)
    assert doc_accepts(doc["components"]["schemas"]["EnqueueRequest"], body, doc) is valid
    status, answer = await harness.json("POST", "/api/jobs", json=body)
    assert status == (202 if valid else 422), answer


CURSOR_CASES = [
    ("0", True),
    ("17", True),
    ("9" * 18, True),
    ("", False),
    ("-1", False),
    ("+1", False),
    (" 1", False),
    ("1_0", False),
    ("\u0663", False),
    ("9" * 19, False),
    ("99999999999999999999", False),
]


@pytest.mark.parametrize(("cursor", "valid"), CURSOR_CASES)
async def test_a_cursor_is_accepted_exactly_when_the_document_says_it_is_valid(
    harness: Harness, cursor: str, valid: bool
) -> None:
    doc = openapi_document(harness.supervisor.kinds)
    assert doc_accepts(parameter_schema(doc, "listJobs", "cursor"), cursor) is valid
    status, answer = await harness.json("GET", "/api/jobs?" + urlencode({"cursor": cursor}))
    assert status == (200 if valid else 422), answer


# The log's window is an exploded form object: its properties are the query parameters, and it holds at most one.
WINDOW_CASES: list[tuple[dict[str, int], bool]] = [
    ({}, True),
    ({"tail_bytes": 5}, True),
    ({"offset": 0}, True),
    ({"offset": 10**12 - 1}, True),
    ({"tail_bytes": 5, "offset": 1}, False),
    ({"offset": 10**12}, False),
    ({"tail_bytes": -1}, False),
]


@pytest.mark.parametrize(("window", "valid"), WINDOW_CASES)
async def test_a_log_window_is_accepted_exactly_when_the_document_says_it_is_valid(
    harness: Harness, window: dict[str, int], valid: bool
) -> None:
    await harness.supervisor.pause()
    doc = openapi_document(harness.supervisor.kinds)
    param = next(p for p in operations(doc)[("GET", "/api/jobs/{job_id}/log")]["parameters"] if p["in"] == "query")
    assert (param["style"], param["explode"]) == ("form", True)
    assert doc_accepts(param["schema"], window) is valid
    _, job = await harness.json("POST", "/api/jobs", json={"kind": "tidy"})
    response = await harness.client.get(f"/api/jobs/{job['job_id']}/log?" + urlencode(window))
    assert response.status_code == (200 if valid else 422)


async def test_a_fixed_route_under_jobs_is_that_route_for_every_method_never_a_job_id(harness: Harness) -> None:
    doc = openapi_document(harness.supervisor.kinds)
    fixed = {path.rsplit("/", 1)[1] for path in doc["paths"] if re.fullmatch(r"/api/jobs/[^/{}]+", path)}
    assert set(JOBS_SUBROUTES) == fixed == {"batch", "bulk", "prune", "reconcile"}
    for name in sorted(fixed):
        path = f"/api/jobs/{name}"
        assert set(doc["paths"][path]) == {"post"}
        # OPTIONS used to advertise GET here (GET /api/jobs/<job_id> matched), and that GET answered 404.
        options = await harness.client.options(path)
        assert set(options.headers["Allow"].replace(" ", "").split(",")) == {"OPTIONS", "POST"}, path
        status, body = await harness.json("GET", path)
        assert status == 405, path
        assert body["error"]["code"] == "method_not_allowed"
        assert not doc_accepts(parameter_schema(doc, "showJob", "job_id"), name)
    assert doc_accepts(parameter_schema(doc, "showJob", "job_id"), "4969cb37d2f8447e9734ed35bf48539b")


# (body, valid?) for a running job's heartbeat with its own token: 204 when valid, 422 when not.
HEARTBEAT_CASES: list[tuple[dict[str, Any], bool]] = [
    ({"completed_units": 0}, True),
    ({"completed_units": 2**63 - 1, "total_units": 2**63 - 1, "stage": "s" * 200}, True),
    ({"completed_units": 1, "total_units": None, "stage": None}, True),
    ({"completed_units": 2**63}, False),  # used to overflow inside sqlite3: 500
    ({"completed_units": 1, "total_units": 10**20}, False),  # likewise
    ({"completed_units": -1}, False),
    ({"completed_units": True}, False),
    ({"completed_units": "1"}, False),
    ({"completed_units": 1, "stage": "s" * 201}, False),
    ({"completed_units": 1, "extra": 1}, False),
    ({"total_units": 1}, False),
]


async def test_a_heartbeat_is_accepted_exactly_when_the_document_says_it_is_valid(harness: Harness) -> None:
    _, job = await harness.json("POST", "/api/jobs", json={"kind": "tokened", "params": {"seconds": 30}})
    token = await wait_log_line(harness.supervisor, job["job_id"])
    schema = openapi_document(harness.supervisor.kinds)["components"]["schemas"]["Heartbeat"]
    url = f"/api/jobs/{job['job_id']}/heartbeat"
    for body, valid in HEARTBEAT_CASES:
        assert doc_accepts(schema, body) is valid, body
        response = await harness.client.post(url, json=body, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == (204 if valid else 422), (body, await response.get_json())
    # A lone surrogate is valid JSON that JSON Schema cannot tell from text (the document's description says it);
    # it used to reach sqlite3 and answer 500.
    response = await harness.client.post(
        url,
        data=b'{"completed_units": 1, "stage": "\\ud800"}',
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert (await response.get_json())["error"]["field"] == "stage"
