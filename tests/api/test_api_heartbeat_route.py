"""``FastRoutes`` (the heartbeat answered ahead of Quart) against Quart's own heartbeat route.

Both apps run over the same supervisor; each request of a table goes to both as the same raw ASGI call, and the answers
must be the same: status, headers and body, the request id aside (each answer has its own). The table covers the
contract: the token before the body, the body's limits and validation, a token that stopped working. A spy on the
fallback shows which requests the fast path really answered itself and which it left to Quart.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import trio
from api_support import Harness, start_tokened, wait_terminal
from quart_trio import QuartTrio

from supervisor._app import FastRoutes, create_app
from supervisor.domain import JobStatus
from supervisor.registry import Ending, Outcome

NESTED = b"[" * 2000


@dataclasses.dataclass
class Exchange:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    body_read: bool  # the app took the request body before it answered (after, it only discards it, as Quart does)

    def normalized(self) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """The answer with its request id replaced by a placeholder (it differs per request)."""
        request_id = dict(self.headers).get(b"x-request-id", b"").decode()
        headers = [(k, b"<id>" if k == b"x-request-id" else v) for k, v in self.headers]
        body = self.body.replace(request_id.encode(), b"<id>") if request_id else self.body
        return self.status, headers, body


async def asgi_post(
    app: QuartTrio, path: str, headers: list[tuple[str, str]], body: bytes, *, with_length: bool = True
) -> Exchange:
    """One POST as hypercorn would present it: the head in the scope, the body as one message."""
    raw_headers = [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers]
    if with_length:
        raw_headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": raw_headers,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "extensions": {},
    }
    answered = trio.Event()
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    read = False
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if pending:
            read = read or not start
            return pending.pop()
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        else:
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    with trio.fail_after(10):
        await app(scope, receive, send)
    return Exchange(start["status"], list(start["headers"]), b"".join(chunks), read)


def json_headers(token: str | None, content_type: str | None = "application/json") -> list[tuple[str, str]]:
    headers = []
    if token is not None:
        headers.append(("Authorization", f"Bearer {token}"))
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    return headers


def body(value: Any) -> bytes:
    return json.dumps(value).encode()


BEAT = body({"completed_units": 1})
PLAIN = "application/json"


# (name, token -> headers, body, expected status, handled by the fast path itself)
Case = tuple[str, Callable[[str], list[tuple[str, str]]], bytes, int, bool]
CASES: list[Case] = [
    ("a beat", lambda t: json_headers(t), body({"completed_units": 1}), 204, True),
    ("every field", lambda t: json_headers(t), body({"completed_units": 2, "total_units": 9, "stage": "s"}), 204, True),
    ("a lower count", lambda t: json_headers(t), body({"completed_units": 0}), 204, True),
    ("charset param", lambda t: json_headers(t, "Application/JSON; charset=utf-8"), BEAT, 204, True),
    ("no token", lambda t: json_headers(None), body({"completed_units": 1}), 401, True),
    ("wrong token", lambda t: json_headers(t + "x"), body({"completed_units": 1}), 401, True),
    ("basic scheme", lambda t: [("Authorization", f"Basic {t}"), ("Content-Type", PLAIN)], b"{}", 401, True),
    ("empty bearer", lambda t: [("Authorization", "Bearer   "), ("Content-Type", PLAIN)], b"{}", 401, True),
    ("wrong token, bad JSON", lambda t: json_headers(t + "x"), b"{", 401, True),
    ("wrong token, not JSON", lambda t: json_headers(t + "x", "text/plain"), b"hello", 401, True),
    ("wrong token, too large", lambda t: json_headers("nope"), b" " * 70_000, 401, True),
    ("text/plain", lambda t: json_headers(t, "text/plain"), body({"completed_units": 1}), 415, True),
    ("no content type", lambda t: json_headers(t, None), body({"completed_units": 1}), 415, True),
    ("too large", lambda t: json_headers(t), b" " * 70_000, 413, True),
    ("bad JSON", lambda t: json_headers(t), b"{", 400, True),
    ("nested", lambda t: json_headers(t), NESTED, 400, True),
    ("NaN", lambda t: json_headers(t), b'{"completed_units": NaN}', 400, True),
    ("not UTF-8", lambda t: json_headers(t), b'{"stage": "\xff"}', 400, True),
    ("a list", lambda t: json_headers(t), b"[1]", 422, True),
    ("missing count", lambda t: json_headers(t), b"{}", 422, True),
    ("negative", lambda t: json_headers(t), body({"completed_units": -1}), 422, True),
    ("past 2^63-1", lambda t: json_headers(t), body({"completed_units": 2**63}), 422, True),
    ("a bool", lambda t: json_headers(t), body({"completed_units": True}), 422, True),
    ("bad total", lambda t: json_headers(t), body({"completed_units": 1, "total_units": -2}), 422, True),
    ("long stage", lambda t: json_headers(t), body({"completed_units": 1, "stage": "x" * 201}), 422, True),
    ("lone surrogate", lambda t: json_headers(t), b'{"completed_units": 1, "stage": "a\\ud800"}', 422, True),
    ("unknown field", lambda t: json_headers(t), body({"completed_units": 1, "eta": 3}), 422, True),
    # Left to Quart, untouched: the fast path never interprets these.
    ("from a web page", lambda t: [*json_headers(t), ("Origin", "http://evil")], BEAT, 403, False),
    ("chunked", lambda t: [*json_headers(t), ("Transfer-Encoding", "chunked")], BEAT, 204, False),
]


class Spy:
    """Counts the requests the fast path hands to Quart."""

    def __init__(self, route: FastRoutes) -> None:
        self.calls = 0
        self._fallback = route.fallback
        route.fallback = self

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        await self._fallback(scope, receive, send)


def fast_route(app: QuartTrio) -> FastRoutes:
    route = app.asgi_app
    assert isinstance(route, FastRoutes)
    return route


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_the_fast_path_answers_exactly_as_quarts_route(harness: Harness, case: Case) -> None:
    name, make_headers, data, status, handled = case
    job_id, token = await start_tokened(harness)
    fast = harness.app
    spy = Spy(fast_route(fast))
    quart_only = create_app(harness.supervisor, fast_routes=False)
    assert not isinstance(quart_only.asgi_app, FastRoutes)
    path = f"/api/jobs/{job_id}/heartbeat"
    chunked = name == "chunked"
    async with quart_only.test_app():
        by_quart = await asgi_post(quart_only, path, make_headers(token), data, with_length=not chunked)
        by_fast = await asgi_post(fast, path, make_headers(token), data, with_length=not chunked)
    assert by_quart.status == status, (by_quart, name)
    assert by_fast.normalized() == by_quart.normalized()
    assert spy.calls == (0 if handled else 1)
    # Each answer carries its own request id, and an error names it.
    request_id = dict(by_fast.headers)[b"x-request-id"].decode()
    assert re.fullmatch(r"[0-9a-f]{16}", request_id)
    if status != 204:
        assert json.loads(by_fast.body)["error"]["request_id"] == request_id


async def test_an_unknown_job_and_an_ended_job_are_401_like_a_wrong_token(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    quart_only = create_app(harness.supervisor, fast_routes=False)
    async with quart_only.test_app():
        for data in (body({"completed_units": 1}), b"{"):
            unknown = "/api/jobs/no-such-job/heartbeat"
            by_quart = await asgi_post(quart_only, unknown, json_headers(token), data)
            by_fast = await asgi_post(harness.app, unknown, json_headers(token), data)
            assert by_quart.status == 401
            assert by_fast.normalized() == by_quart.normalized()
        await harness.json("POST", f"/api/jobs/{job_id}/cancel")
        assert (await wait_terminal(harness.supervisor, job_id)).status is JobStatus.CANCELLED
        path = f"/api/jobs/{job_id}/heartbeat"
        for data in (body({"completed_units": 1}), b"{", body({"completed_units": -1})):
            by_quart = await asgi_post(quart_only, path, json_headers(token), data)
            by_fast = await asgi_post(harness.app, path, json_headers(token), data)
            assert by_quart.status == 401
            assert by_fast.normalized() == by_quart.normalized()


async def test_without_the_token_the_body_is_never_read(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    path = f"/api/jobs/{job_id}/heartbeat"
    for headers in (json_headers(None), json_headers(token + "x"), json_headers("other")):
        answer = await asgi_post(harness.app, path, headers, body({"completed_units": 1}))
        assert (answer.status, answer.body_read) == (401, False)
    answer = await asgi_post(harness.app, "/api/jobs/no-such-job/heartbeat", json_headers(token), b"{")
    assert (answer.status, answer.body_read) == (401, False)
    # With the token, the body is read (and the beat recorded).
    answer = await asgi_post(harness.app, path, json_headers(token), body({"completed_units": 4}))
    assert (answer.status, answer.body_read) == (204, True)
    assert (await harness.supervisor.get(job_id)).completed_units == 4


async def test_a_token_of_a_job_ended_behind_the_supervisors_back_is_401_whatever_the_body(harness: Harness) -> None:
    """The token is admitted from memory for a job this boot saw running; if the row ended without this supervisor
    hearing of it (another process, say), the write's own check and the re-check of a refused body still make it 401.
    """
    job_id, token = await start_tokened(harness)
    path = f"/api/jobs/{job_id}/heartbeat"
    answer = await asgi_post(harness.app, path, json_headers(token), body({"completed_units": 1}))
    assert answer.status == 204
    assert harness.supervisor.heartbeats.tokens.admits(job_id, token)  # the path under test: admitted from memory
    await harness.supervisor.registry.finalize(job_id, Ending(Outcome(JobStatus.FAILED, "ended_elsewhere")))
    for data in (b"{", body({"completed_units": -1}), body({"completed_units": 2})):
        answer = await asgi_post(harness.app, path, json_headers(token), data)
        assert answer.status == 401, data
        assert json.loads(answer.body)["error"]["code"] == "unauthorized"
    assert (await harness.supervisor.get(job_id)).completed_units == 1
