"""Each route is declared once (supervisor/api/_routes.py): the app's route map, the routes that need no API token,
the OpenAPI document's paths and the route table of docs/api.md are made from those declarations (ADR 0015),
and the CLI's client asks only for routes that are declared, with their methods."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule

from supervisor.api import CONVERTERS, JOBS_SUBROUTES, PUBLIC_ENDPOINTS, ROUTES, RouteTable, routes_table
from supervisor.cli import Client, NotTheApi

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import doc_tables  # noqa: E402 - tools/ is not a package


def test_the_api_page_shows_the_declared_routes() -> None:
    page = doc_tables.ROUTES.page.read_text()
    assert doc_tables.ROUTES.rendered(page) == page, "docs/api.md is stale: run .venv/bin/python tools/doc_tables.py"
    for route in ROUTES:
        assert f"| `{route.method} {route.path}` | {route.summary} |" in routes_table()


def test_the_unauthenticated_routes_and_the_fixed_names_follow_the_declarations() -> None:
    assert {"health", "metrics", "heartbeat"} == PUBLIC_ENDPOINTS
    assert JOBS_SUBROUTES == ("batch", "bulk", "prune", "reconcile")


def test_what_every_route_of_a_kind_answers_is_added_once() -> None:
    for route in ROUTES:
        answers = route.answers()
        assert ("401" in answers) == (route.auth != "public"), route.path
        assert ("403" in answers) == (route.method == "POST"), route.path
        assert {"400", "413", "415"} <= set(answers) or route.body is None, route.path
        assert "503" in answers or not route.over_registry, route.path
    heartbeat = next(r for r in ROUTES if r.endpoint == "heartbeat")
    # A route's own description of a status wins over the generic one.
    own = "the token is not this job's, or no job has this id (or it no longer runs)"
    assert heartbeat.answers()["401"]["description"] == own


def test_a_route_is_declared_once_and_summarised_in_one_line() -> None:
    table = RouteTable()

    @table.get("/x", "x", auth="read")
    async def x(supervisor: Any) -> Any:
        """One line."""

    with pytest.raises(TypeError, match="declared twice"):

        @table.get("/x", "y", auth="read")
        async def y(supervisor: Any) -> Any:
            """Another."""

    with pytest.raises(TypeError, match="declared twice"):

        @table.post("/z", "x", auth="operator")
        async def z(supervisor: Any) -> Any:
            """Another operation id reused."""

    with pytest.raises(TypeError, match="one-line docstring"):

        @table.get("/w", "w", auth="public")
        async def w(supervisor: Any) -> Any:
            pass

    with pytest.raises(TypeError, match="auth 'api' is not one of"):

        @table.get("/v", "v", auth="api")  # type: ignore[arg-type]
        async def v(supervisor: Any) -> Any:
            """Who may call it is a scope, the job's token, or public."""

    assert [r.endpoint for r in table] == ["x"]


# A value for each argument the client's methods take.
SAMPLES: dict[str, Any] = {
    "kind": "sleep",
    "params": {"seconds": 1},
    "jobs": [{"kind": "sleep"}],
    "job_id": "abc123",
    "host_id": "host-a",
    "dry_run": True,
    "action": "retry",
}


def test_the_client_asks_only_for_declared_routes() -> None:
    rules = [Rule(r.rule, endpoint=r.endpoint, methods=[r.method]) for r in ROUTES]
    routes = Map(rules, converters=CONVERTERS)
    adapter = routes.bind("localhost")
    asked: list[tuple[str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.path))
        return httpx.Response(200, json={})

    client = Client("http://localhost", transport=httpx.MockTransport(answer))
    calls = [
        (name, method)
        for name, method in inspect.getmembers(client, inspect.ismethod)
        if not name.startswith("_") and name not in ("close",)
    ]
    for _, method in calls:
        wanted = inspect.signature(method).parameters
        try:
            method(**{arg: SAMPLES[arg] for arg, p in wanted.items() if p.default is inspect.Parameter.empty})
        except NotTheApi:
            pass  # the mock's empty answer is not this API's: what matters here is the request, already made
    assert len(asked) == len(calls) >= 15
    for verb, path in asked:
        try:
            adapter.match(path, method=verb)
        except (NotFound, MethodNotAllowed):  # pragma: no cover - the failure being tested for
            pytest.fail(f"the client asks for {verb} {path}, which no route declares")
