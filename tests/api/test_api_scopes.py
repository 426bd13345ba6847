"""Scoped API tokens (ADR 0017): every route x every scope x {no token, unknown, revoked}.

The table of expected answers is made from the route declarations (``ROUTES``: each route's ``auth``), so a route
added later is in it without editing this file: a token of at least the route's scope passes authentication; a
smaller one is a 403 naming the scope needed; none, an unknown one or a revoked one is a 401. Nothing refused
changes anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
from api_support import API_TOKEN, Harness, OpenHarness, wait_for_job

from supervisor.api import ROUTES, Route
from supervisor.domain import SCOPES, ConfigError, TokenFile, scope_allows, utc_now

CALLERS = ("none", "unknown", "revoked", *SCOPES)


@pytest.fixture
def tokens_path(tmp_path: Path) -> Path:
    return tmp_path / "api-tokens.toml"


@pytest.fixture
def tokens(tokens_path: Path) -> dict[str, str]:
    """A token of each scope (named after it), and one revoked before the server reads the file."""
    file = TokenFile(tokens_path)
    made = {scope: file.add(f"{scope}-bot", scope, utc_now()) for scope in SCOPES}
    made["revoked"] = file.add("old-bot", "operator", utc_now())
    file.revoke("old-bot")
    made["unknown"] = "pjs_" + "x" * 43
    return made


@pytest.fixture
async def scoped(open_harness: OpenHarness, tokens_path: Path, tokens: dict[str, str]) -> AsyncIterator[Harness]:
    async with open_harness(api_tokens_file=tokens_path, max_concurrent=1) as h:
        yield h


def _headers(tokens: dict[str, str], caller: str) -> dict[str, str]:
    return {} if caller == "none" else {"Authorization": f"Bearer {tokens[caller]}"}


def _request(route: Route, job_id: str) -> tuple[str, dict[str, Any]]:
    path = re.sub(r"\{[^}]+\}", job_id, route.path)
    if route.path == "/api/events":
        path += "?follow=false"  # a stream that ends: this client reads whole answers
    body = {"jobs": [{"kind": "tidy"}]} if route.path.endswith("/batch") else {"kind": "tidy"}
    return path, {"json": body} if route.method == "POST" else {}


def expected(route: Route, caller: str) -> int | None:
    """The answer the table says: 401, 403, or None (authentication passed: the route's own answer)."""
    assert route.scope is not None
    if caller in ("none", "unknown", "revoked"):
        return 401
    return None if scope_allows(caller, route.scope) else 403  # type: ignore[arg-type]


SCOPED_ROUTES = [route for route in ROUTES if route.scope is not None]


def test_every_route_declares_who_may_call_it_and_the_table_covers_each() -> None:
    assert {route.auth for route in ROUTES} <= {"read", "enqueue", "operator", "job", "public"}
    assert {r.operation_id for r in ROUTES if r.scope is None} == {"health", "metrics", "heartbeat"}
    # What the issue names: every GET is read; adding jobs is enqueue; every other change is operator.
    for route in SCOPED_ROUTES:
        if route.method == "GET":
            assert route.scope == "read", route.path
        elif route.path in ("/api/jobs", "/api/jobs/batch"):
            assert route.scope == "enqueue"
        else:
            assert route.scope == "operator", route.path
    with pytest.raises(TypeError):
        ROUTES.get("/api/new", "newRoute")  # type: ignore[call-arg]  # no default scope


async def test_each_route_answers_each_caller_as_its_declared_scope_says_INV_LEAST_SCOPE(
    scoped: Harness, tokens: dict[str, str]
) -> None:
    sup = scoped.supervisor
    holder = (await sup.enqueue("sleep", {"seconds": 30})).job
    await wait_for_job(sup, holder.job_id, lambda job: job.status == "running")
    waiting = (await sup.enqueue("tidy", {})).job
    table: list[tuple[str, str, str, int]] = []
    for route in SCOPED_ROUTES:
        for caller in CALLERS:
            want = expected(route, caller)
            if want is None:
                continue  # passing callers: below, after every refusal was shown to change nothing
            path, extra = _request(route, waiting.job_id)
            response = await scoped.client.open(path, method=route.method, headers=_headers(tokens, caller), **extra)
            body = await response.get_json()
            table.append((route.method, route.path, caller, response.status_code))
            assert response.status_code == want, (route.method, route.path, caller, body)
            if want == 403:
                assert body["error"]["code"] == "insufficient_scope"
                assert f"scope {route.scope!r}" in body["error"]["message"]
                assert f"token '{caller}-bot' has scope {caller!r}" in body["error"]["message"]
                assert response.headers["WWW-Authenticate"] == (
                    f'Bearer error="insufficient_scope", scope="{route.scope}"'
                )
            else:
                assert body["error"]["code"] == "unauthorized"
    # 3 refused callers per route, and a refused scope for every route above read.
    above_read = [r for r in SCOPED_ROUTES if r.scope != "read"]
    operator_only = [r for r in SCOPED_ROUTES if r.scope == "operator"]
    assert len(table) == 3 * len(SCOPED_ROUTES) + len(above_read) + len(operator_only)
    # Nothing refused changed anything: the waiting job waits, the queue runs, no job was added.
    assert await sup.get(waiting.job_id) == waiting
    assert not await sup.is_paused()
    counts = await sup.registry.counts()
    assert (counts["running"], counts["queued"], sum(counts.values())) == (1, 1, 2)

    # OPTIONS (which methods a route takes) changes nothing: a read token may ask it of every route, none may not.
    for route in SCOPED_ROUTES:
        path, _ = _request(route, waiting.job_id)
        asked = await scoped.client.open(path, method="OPTIONS", headers=_headers(tokens, "read"))
        assert asked.status_code == 200 and route.method in asked.headers["Allow"], route.path
        assert (await scoped.client.open(path, method="OPTIONS")).status_code == 401
    for route in SCOPED_ROUTES:
        for caller in SCOPES:
            if expected(route, caller) is not None:
                continue
            path, extra = _request(route, waiting.job_id)
            response = await scoped.client.open(path, method=route.method, headers=_headers(tokens, caller), **extra)
            assert response.status_code not in (401, 403), (route.method, route.path, caller)


async def test_a_token_revoked_while_serving_is_refused_after_the_reload(
    scoped: Harness, tokens: dict[str, str], tokens_path: Path
) -> None:
    good = _headers(tokens, "enqueue")
    assert (await scoped.client.get("/api/queue", headers=good)).status_code == 200
    await trio.to_thread.run_sync(TokenFile(tokens_path).revoke, "enqueue-bot")
    assert (await scoped.client.get("/api/queue", headers=good)).status_code == 200  # in force until the reload
    credentials = scoped.credentials
    assert credentials is not None
    await trio.to_thread.run_sync(credentials.load)  # what a SIGHUP does
    status, body = await scoped.json("GET", "/api/queue", headers=good)
    assert (status, body["error"]["code"]) == (401, "unauthorized")
    # A file that cannot be parsed keeps the tokens in force.
    await trio.Path(tokens_path).write_text("[tokens.broken\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        await trio.to_thread.run_sync(credentials.load)
    assert (await scoped.client.get("/api/queue", headers=_headers(tokens, "read"))).status_code == 200
    # A removed file revokes every named token, and the API stays closed: fail closed, never open.
    await trio.Path(tokens_path).unlink()
    assert await trio.to_thread.run_sync(credentials.load) == 0
    assert credentials.removed and credentials.required
    for caller in ("read", "operator", "none"):
        assert (await scoped.client.get("/api/queue", headers=_headers(tokens, caller))).status_code == 401


async def test_every_action_names_its_token_in_the_row_and_the_log_never_the_token_INV_ACTION_ATTRIBUTED(
    scoped: Harness, tokens: dict[str, str]
) -> None:
    with structlog.testing.capture_logs() as logs:
        status, answer = await scoped.json(
            "POST", "/api/jobs", json={"kind": "sleep", "params": {"seconds": 30}}, headers=_headers(tokens, "enqueue")
        )
        assert status == 202
        await scoped.supervisor.pause()  # the second job waits
        _, queued = await scoped.json("POST", "/api/jobs/batch", json={"jobs": [{"kind": "tidy"}]},
                                      headers=_headers(tokens, "operator"))  # fmt: skip
        queued_id = queued["jobs"][0]["job_id"]
        _, cancelled = await scoped.json("POST", f"/api/jobs/{queued_id}/cancel", headers=_headers(tokens, "operator"))
    row = await scoped.supervisor.get(answer["job_id"])
    assert (row.enqueued_by, row.cancelled_by) == ("enqueue-bot", None)
    assert (cancelled["enqueued_by"], cancelled["cancelled_by"], cancelled["status"]) == (
        "operator-bot", "operator-bot", "cancelled",
    )  # fmt: skip
    lines = [e for e in logs if e["event"] == "api_request"]
    assert [(e["path"], e["by"], e["status"]) for e in lines] == [
        ("/api/jobs", "enqueue-bot", 202),
        ("/api/jobs/batch", "operator-bot", 202),
        (f"/api/jobs/{queued_id}/cancel", "operator-bot", 200),
    ]
    text = repr(logs)
    assert not any(token in text for token in tokens.values())
    # The events (the webhook's bodies) carry the row, so they carry who asked.
    stream = await scoped.client.get("/api/events?backlog=true&follow=false", headers=_headers(tokens, "read"))
    bodies = [json.loads(line[len("data: ") :]) for line in (await stream.get_data(as_text=True)).splitlines()
              if line.startswith("data: ")]  # fmt: skip
    cancel = [b for b in bodies if b["job"]["job_id"] == queued_id and b["job"]["status"] == "cancelled"]
    assert [(b["job"]["enqueued_by"], b["job"]["cancelled_by"]) for b in cancel] == [("operator-bot", "operator-bot")]


async def test_the_operator_token_acts_as_operator_and_a_server_without_tokens_as_anonymous(
    open_harness: OpenHarness,
) -> None:
    async with open_harness(api_token=API_TOKEN) as authed:
        _, answer = await authed.json(
            "POST", "/api/jobs", json={"kind": "tidy"}, headers={"Authorization": f"Bearer {API_TOKEN}"}
        )
        assert (await authed.supervisor.get(answer["job_id"])).enqueued_by == "operator"
    async with open_harness(api_token=None) as open_:
        assert open_.credentials is not None and not open_.credentials.required
        # Not tidy: a coalescing kind could answer the first harness's row while it still waits.
        _, answer = await open_.json("POST", "/api/jobs", json={"kind": "fail"})
        assert (await open_.supervisor.get(answer["job_id"])).enqueued_by == "anonymous"
