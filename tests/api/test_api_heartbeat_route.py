"""The heartbeat route's contract, request by request (Quart's route is the only dispatcher).

Each request of a table goes to the app as a raw ASGI call, as hypercorn presents it: the token before the body,
the body's limits and validation, a token that stopped working, a request from a web page, a chunked body. Each
answer carries its own request id, and an error names it.

The same table goes, as raw bytes, to a live server (hypercorn + quart-trio on port 0, as in production): what the
wire adds (``date``, ``server``, and ``Connection: close`` on an answer sent before the body's end, which the
connection then honours) aside, the answer is the app's.
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
from api_support import Harness, Live, MakeLive, start_tokened, wait_log_line, wait_terminal
from quart.wrappers import Request
from quart_trio import QuartTrio
from test_http_edge import EXCHANGE_S, HOST, Answer, connect

from supervisor.api import MAX_BODY_BYTES, HttpLimits, create_app
from supervisor.domain import JobStatus
from supervisor.registry import Ending, Outcome

NESTED = b"[" * 2000


@dataclasses.dataclass
class Exchange:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    body_read: bool  # the app took the request body before it answered (after, it only discards it, as Quart does)

    def normalized(self) -> tuple[int, tuple[tuple[bytes, bytes], ...], bytes]:
        """The answer with its request id replaced by a placeholder (it differs per request)."""
        request_id = dict(self.headers).get(b"x-request-id", b"").decode()
        headers = [(k, b"<id>" if k == b"x-request-id" else v) for k, v in self.headers]
        body = self.body.replace(request_id.encode(), b"<id>") if request_id else self.body
        return self.status, tuple(headers), body


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


# (name, token -> headers, body, expected status)
Case = tuple[str, Callable[[str], list[tuple[str, str]]], bytes, int]
# The error code each status of the table answers with (the one error tree's, generically).
CODES = {
    401: "unauthorized",
    403: "cross_origin",
    400: "malformed_json",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
}
CASES: list[Case] = [
    ("a beat", lambda t: json_headers(t), body({"completed_units": 1}), 204),
    ("every field", lambda t: json_headers(t), body({"completed_units": 2, "total_units": 9, "stage": "s"}), 204),
    ("a lower count", lambda t: json_headers(t), body({"completed_units": 0}), 204),
    ("charset param", lambda t: json_headers(t, "Application/JSON; charset=utf-8"), BEAT, 204),
    ("no token", lambda t: json_headers(None), body({"completed_units": 1}), 401),
    ("wrong token", lambda t: json_headers(t + "x"), body({"completed_units": 1}), 401),
    ("basic scheme", lambda t: [("Authorization", f"Basic {t}"), ("Content-Type", PLAIN)], b"{}", 401),
    ("empty bearer", lambda t: [("Authorization", "Bearer   "), ("Content-Type", PLAIN)], b"{}", 401),
    ("wrong token, bad JSON", lambda t: json_headers(t + "x"), b"{", 401),
    ("wrong token, not JSON", lambda t: json_headers(t + "x", "text/plain"), b"hello", 401),
    ("wrong token, too large", lambda t: json_headers("nope"), b" " * 70_000, 401),
    ("text/plain", lambda t: json_headers(t, "text/plain"), body({"completed_units": 1}), 415),
    ("no content type", lambda t: json_headers(t, None), body({"completed_units": 1}), 415),
    ("too large", lambda t: json_headers(t), b" " * 70_000, 413),
    ("bad JSON", lambda t: json_headers(t), b"{", 400),
    ("nested", lambda t: json_headers(t), NESTED, 400),
    ("NaN", lambda t: json_headers(t), b'{"completed_units": NaN}', 400),
    ("not UTF-8", lambda t: json_headers(t), b'{"stage": "\xff"}', 400),
    ("a list", lambda t: json_headers(t), b"[1]", 422),
    ("missing count", lambda t: json_headers(t), b"{}", 422),
    ("negative", lambda t: json_headers(t), body({"completed_units": -1}), 422),
    ("past 2^63-1", lambda t: json_headers(t), body({"completed_units": 2**63}), 422),
    ("a bool", lambda t: json_headers(t), body({"completed_units": True}), 422),
    ("bad total", lambda t: json_headers(t), body({"completed_units": 1, "total_units": -2}), 422),
    ("long stage", lambda t: json_headers(t), body({"completed_units": 1, "stage": "x" * 201}), 422),
    ("lone surrogate", lambda t: json_headers(t), b'{"completed_units": 1, "stage": "a\\ud800"}', 422),
    ("unknown field", lambda t: json_headers(t), body({"completed_units": 1, "eta": 3}), 422),
    ("from a web page", lambda t: [*json_headers(t), ("Origin", "http://evil")], BEAT, 403),
    ("chunked", lambda t: [*json_headers(t), ("Transfer-Encoding", "chunked")], BEAT, 204),
]


def request_bytes(path: str, headers: list[tuple[str, str]], data: bytes, *, chunked: bool) -> bytes:
    head = f"POST {path} HTTP/1.1\r\n".encode() + HOST
    for name, value in headers:
        head += f"{name}: {value}\r\n".encode("latin-1")
    if chunked:
        return head + b"\r\n" + f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    return head + f"Content-Length: {len(data)}\r\n\r\n".encode() + data


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_each_request_is_answered_by_the_routes_contract(harness: Harness, case: Case) -> None:
    name, make_headers, data, status = case
    job_id, token = await start_tokened(harness)
    path = f"/api/jobs/{job_id}/heartbeat"
    answer = await asgi_post(harness.app, path, make_headers(token), data, with_length=name != "chunked")
    assert answer.status == status, (answer, name)
    headers = dict(answer.headers)
    assert headers[b"x-content-type-options"] == b"nosniff"
    # Each answer carries its own request id, and an error names it.
    request_id = headers[b"x-request-id"].decode()
    assert re.fullmatch(r"[0-9a-f]{16}", request_id)
    beats = (await harness.supervisor.get(job_id)).completed_units
    if status == 204:
        assert answer.body == b""
        assert beats == json.loads(data)["completed_units"]
        return
    error = json.loads(answer.body)["error"]
    assert (error["code"], error["request_id"]) == (CODES[status], request_id)
    if status == 422:
        assert error["field"] in ("body", "completed_units", "total_units", "stage", "eta"), error
    assert beats == 0, "a refused beat records nothing"


async def test_an_unknown_job_and_an_ended_job_are_401_like_a_wrong_token(harness: Harness) -> None:
    job_id, token = await start_tokened(harness)
    answers = []
    for data in (body({"completed_units": 1}), b"{"):
        answers.append(await asgi_post(harness.app, "/api/jobs/no-such-job/heartbeat", json_headers(token), data))
    await harness.json("POST", f"/api/jobs/{job_id}/cancel")
    assert (await wait_terminal(harness.supervisor, job_id)).status is JobStatus.CANCELLED
    path = f"/api/jobs/{job_id}/heartbeat"
    for data in (body({"completed_units": 1}), b"{", body({"completed_units": -1})):
        answers.append(await asgi_post(harness.app, path, json_headers(token), data))
    wrong = await asgi_post(harness.app, path, json_headers(token + "x"), body({"completed_units": 1}))
    # The same answer as a wrong token's, the request id aside: nothing tells a job that ended from one never known.
    assert {a.normalized() for a in answers} == {wrong.normalized()}
    assert wrong.status == 401


async def test_without_the_token_the_body_is_never_parsed(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    # Quart takes the body off the connection as it comes; what matters is that the route asks Quart for it (then
    # its parse, its limits, its validation) only after the token: a caller without it learns nothing from the answer.
    parsed: list[object] = []
    request_class = harness.app.request_class
    real = request_class.get_data

    async def get_data(self: Request, *args: Any, **kwargs: Any) -> Any:
        data = await real(self, *args, **kwargs)
        parsed.append(json.loads(data))
        return data

    job_id, token = await start_tokened(harness)
    monkeypatch.setattr(request_class, "get_data", get_data)
    path = f"/api/jobs/{job_id}/heartbeat"
    for headers in (json_headers(None), json_headers(token + "x"), json_headers("other")):
        answer = await asgi_post(harness.app, path, headers, body({"completed_units": 1}))
        assert answer.status == 401
    answer = await asgi_post(harness.app, "/api/jobs/no-such-job/heartbeat", json_headers(token), b"{")
    assert answer.status == 401
    assert parsed == []
    # With the token, the body is parsed (and the beat recorded).
    answer = await asgi_post(harness.app, path, json_headers(token), body({"completed_units": 4}))
    assert answer.status == 204
    assert parsed == [{"completed_units": 4}]
    assert (await harness.supervisor.get(job_id)).completed_units == 4


async def test_a_token_of_a_job_ended_behind_the_supervisors_back_is_401_once_its_write_finds_it(
    harness: Harness,
) -> None:
    """The token is admitted from memory for a job this boot saw running; if the row ended without this supervisor
    hearing of it (another process, say), a refused body's re-check is the 401 at once, and a good body is taken
    (written behind, ADR 0018): its write finds the row ended, forgets the token, and every later beat is the 401.
    Nothing reaches the row."""
    job_id, token = await start_tokened(harness)
    path = f"/api/jobs/{job_id}/heartbeat"
    answer = await asgi_post(harness.app, path, json_headers(token), body({"completed_units": 1}))
    assert answer.status == 204
    assert harness.supervisor.heartbeats.tokens.admits(job_id, token)  # the path under test: admitted from memory
    await harness.supervisor.heartbeats.flush()
    await harness.supervisor.registry.finalize(job_id, Ending(Outcome(JobStatus.FAILED, "ended_elsewhere")))
    for data in (b"{", body({"completed_units": -1})):
        answer = await asgi_post(harness.app, path, json_headers(token), data)
        assert answer.status == 401, data
        assert json.loads(answer.body)["error"]["code"] == "unauthorized"
    answer = await asgi_post(harness.app, path, json_headers(token), body({"completed_units": 2}))
    assert answer.status == 204  # taken from memory
    assert (await harness.supervisor.get(job_id)).completed_units == 1  # the read writes it: refused, forgotten
    answer = await asgi_post(harness.app, path, json_headers(token), body({"completed_units": 3}))
    assert answer.status == 401
    assert json.loads(answer.body)["error"]["code"] == "unauthorized"


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
async def test_a_live_servers_answer_is_the_apps_answer(make_live: MakeLive, case: Case) -> None:
    name, make_headers, data, status = case
    live = await make_live()
    job_id, token = await running_job(live)
    path = f"/api/jobs/{job_id}/heartbeat"
    chunked = name == "chunked"
    app = create_app(live.supervisor)
    async with app.test_app():
        by_app = await asgi_post(app, path, make_headers(token), data, with_length=not chunked)
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
    assert by_app.status == status
    by_app_answer = Answer(by_app.status, {k.decode(): v.decode() for k, v in by_app.headers}, by_app.body)
    assert _wire_normalized(answer) == _wire_normalized(by_app_answer)
    if status != 204:
        assert json.loads(answer.body)["error"]["request_id"] == answer.headers["x-request-id"]


async def test_a_client_gone_in_the_middle_of_a_body_leaves_the_server_serving(make_live: MakeLive) -> None:
    # A body timeout far beyond this test: only the client's leaving ends the request.
    live = await make_live(limits=HttpLimits(body_timeout_s=30))
    job_id, token = await running_job(live)
    headers = json_headers(token)
    path = f"/api/jobs/{job_id}/heartbeat"
    for _ in range(3):
        client = await connect(live)
        async with client.stream:
            await client.send(request_bytes(path, headers, body({"completed_units": 7}), chunked=False)[:-3])
        # The client is gone: the body's reader gets http.disconnect, and nothing is recorded or answered.
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
