"""``FastRoutes`` (the heartbeat answered ahead of Quart) against Quart's own heartbeat route.

Both apps run over the same supervisor; each request of a table goes to both as the same raw ASGI call, and the answers
must be the same: status, headers and body, the request id aside (each answer has its own). The table covers the
contract: the token before the body, the body's limits and validation, a token that stopped working. A spy on the
fallback shows which requests the fast path really answered itself and which it left to Quart.

The same table goes, as raw bytes, to a live server (hypercorn + quart-trio on port 0, as in production): what the
wire adds (``date``, ``server``, and ``Connection: close`` on an answer sent before the body's end, which the
connection then honours) aside, the answer is Quart's route's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import trio
from api_support import Harness, Live, MakeLive, poll_until, start_tokened, wait_log_line, wait_terminal
from quart_trio import QuartTrio
from test_http_edge import EXCHANGE_S, HOST, Answer, connect

from supervisor.api import MAX_BODY_BYTES, ClientGone, FastRoutes, HttpLimits, create_app
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


class LiveSpy:
    """Counts the requests ``FastRoutes`` took itself in a live server (whose app the test does not hold), and those
    of them whose client left before its body was complete (``gone``: nothing answered)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.gone = 0
        original = FastRoutes._respond

        async def respond(route: FastRoutes, *args: Any) -> Any:
            self.calls += 1
            try:
                return await original(route, *args)
            except ClientGone:
                self.gone += 1
                raise

        monkeypatch.setattr(FastRoutes, "_respond", respond)


def request_bytes(path: str, headers: list[tuple[str, str]], data: bytes, *, chunked: bool) -> bytes:
    head = f"POST {path} HTTP/1.1\r\n".encode() + HOST
    for name, value in headers:
        head += f"{name}: {value}\r\n".encode("latin-1")
    if chunked:
        return head + b"\r\n" + f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    return head + f"Content-Length: {len(data)}\r\n\r\n".encode() + data


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


# -- over a live server's socket ----------------------------------------------------------------------------------

# Added by the HTTP stack to every answer, whichever route made it.
_STACK_HEADERS = {"date", "server", "connection"}


def _wire_normalized(answer: Answer) -> tuple[int, dict[str, str], bytes]:
    request_id = answer.headers.get("x-request-id", "")
    headers = {k: ("<id>" if k == "x-request-id" else v) for k, v in answer.headers.items() if k not in _STACK_HEADERS}
    data = answer.body.replace(request_id.encode(), b"<id>") if request_id else answer.body
    return answer.status, headers, data


async def running_job(live: Live) -> tuple[str, str]:
    result = await live.supervisor.enqueue("tokened", {"seconds": 30.0})
    return result.job.job_id, await wait_log_line(live.supervisor, result.job.job_id)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_a_live_servers_answer_is_quarts_route_answer(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    name, make_headers, data, status, handled = case
    live = await make_live()
    job_id, token = await running_job(live)
    spy = LiveSpy(monkeypatch)
    path = f"/api/jobs/{job_id}/heartbeat"
    chunked = name == "chunked"
    quart_only = create_app(live.supervisor, fast_routes=False)
    async with quart_only.test_app():
        by_quart = await asgi_post(quart_only, path, make_headers(token), data, with_length=not chunked)
    client = await connect(live)
    async with client.stream:
        sent = request_bytes(path, make_headers(token), data, chunked=chunked)
        # A body the server refuses unread is not sent whole: the answer comes before its end, so it closes the
        # connection. Any other request arrives whole, and its connection is kept.
        cut = len(data) > MAX_BODY_BYTES
        await client.send(sent[: len(sent) - len(data) + 1024] if cut else sent)
        answer = await client.answer()
        assert answer.closes == cut, (name, answer.headers)
        if cut:
            await client.closed_by_server()
    assert by_quart.status == status
    by_quart_answer = Answer(by_quart.status, {k.decode(): v.decode() for k, v in by_quart.headers}, by_quart.body)
    assert _wire_normalized(answer) == _wire_normalized(by_quart_answer)
    assert spy.calls == (1 if handled else 0)
    if status != 204:
        assert json.loads(answer.body)["error"]["request_id"] == answer.headers["x-request-id"]


async def test_a_client_gone_in_the_middle_of_a_body_leaves_the_server_serving(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A body timeout far beyond this test: only the client's leaving ends the request.
    live = await make_live(limits=HttpLimits(body_timeout_s=30))
    job_id, token = await running_job(live)
    spy = LiveSpy(monkeypatch)
    headers = json_headers(token)
    path = f"/api/jobs/{job_id}/heartbeat"
    for _ in range(3):
        client = await connect(live)
        async with client.stream:
            await client.send(request_bytes(path, headers, body({"completed_units": 7}), chunked=False)[:-3])
        # The client is gone: the body's reader gets http.disconnect, and nothing is recorded or answered.

    async def all_gone() -> bool | None:
        return True if spy.gone == 3 else None

    await poll_until(all_gone, limit_s=EXCHANGE_S)  # the server meets each client's leaving in its own time
    assert spy.calls == 3
    fresh = await connect(live)
    async with fresh.stream:
        await fresh.send(request_bytes(path, headers, body({"completed_units": 2}), chunked=False))
        with trio.fail_after(EXCHANGE_S):
            assert (await fresh.answer()).status == 204
    assert (await live.supervisor.get(job_id)).completed_units == 2


async def test_an_answer_before_the_body_closes_the_connection(make_live: MakeLive) -> None:
    # A wrong token is answered at once (401), the body unread: what follows on the connection could be that body,
    # so it must never be read as a next request. The answer says Connection: close, and the server closes.
    live = await make_live()
    job_id, token = await running_job(live)
    path = f"/api/jobs/{job_id}/heartbeat"
    smuggled = request_bytes(path, json_headers(token), body({"completed_units": 9}), chunked=False)
    head = request_bytes(path, json_headers(token + "x"), b"x" * len(smuggled), chunked=False)[: -len(smuggled)]
    client = await connect(live)
    async with client.stream:
        await client.send(head)
        answer = await client.answer()
        assert (answer.status, answer.closes) == (401, True)
        with contextlib.suppress(trio.BrokenResourceError):
            await client.send(smuggled)  # the "body": a whole heartbeat, which must not be taken as one
        assert await client.closed_by_server() == b""
    assert (await live.supervisor.get(job_id)).completed_units == 0
