"""``POST /api/jobs`` answered by ``FastRoutes`` (ahead of Quart) against Quart's own enqueue route.

Every request of the table goes to Quart's route (the ASGI app built with ``fast_routes=False``, over the same
supervisor) and to the fast path, as a raw ASGI call and as raw bytes on a live server's socket; the answers must be
the same: status, headers and body, the request id and the new job's id aside (each answer has its own). The queue
is paused, so a job enqueued by one path is still queued when the other path enqueues its twin: both answers name
the position their job got. The server requires an API token, so the table covers the token before the body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from api_support import API_TOKEN, Harness, Live, MakeLive, OpenHarness, wait_terminal
from test_api_heartbeat_route import (
    NESTED,
    PLAIN,
    Exchange,
    LiveSpy,
    Spy,
    asgi_post,
    body,
    fast_route,
    json_headers,
    request_bytes,
)
from test_http_edge import Answer, connect

from supervisor.api import MAX_BODY_BYTES, create_app
from supervisor.domain import ApiToken, JobStatus

PATH = "/api/jobs"
SLEEP = body({"kind": "sleep", "params": {"seconds": 5}})

# (name, api token -> headers, body, expected status, handled by the fast path itself)
Case = tuple[str, Callable[[str], list[tuple[str, str]]], bytes, int, bool]
CASES: list[Case] = [
    ("a job", lambda t: json_headers(t), SLEEP, 202, True),
    ("no params", lambda t: json_headers(t), body({"kind": "fail"}), 202, True),
    ("null params", lambda t: json_headers(t), body({"kind": "fail", "params": None}), 202, True),
    ("charset param", lambda t: json_headers(t, "Application/JSON; charset=utf-8"), SLEEP, 202, True),
    ("no token", lambda t: json_headers(None), SLEEP, 401, True),
    ("wrong token", lambda t: json_headers(t + "x"), SLEEP, 401, True),
    ("a job token's shape", lambda t: json_headers("0" * 64), SLEEP, 401, True),
    ("basic scheme", lambda t: [("Authorization", f"Basic {t}"), ("Content-Type", PLAIN)], SLEEP, 401, True),
    ("wrong token, bad JSON", lambda t: json_headers(t + "x"), b"{", 401, True),
    ("wrong token, too large", lambda t: json_headers("nope"), b" " * 70_000, 401, True),
    ("text/plain", lambda t: json_headers(t, "text/plain"), SLEEP, 415, True),
    ("no content type", lambda t: json_headers(t, None), SLEEP, 415, True),
    ("too large", lambda t: json_headers(t), b" " * 70_000, 413, True),
    ("bad JSON", lambda t: json_headers(t), b"{", 400, True),
    ("nested", lambda t: json_headers(t), NESTED, 400, True),
    ("NaN", lambda t: json_headers(t), b'{"kind": "sleep", "params": {"seconds": NaN}}', 400, True),
    ("not UTF-8", lambda t: json_headers(t), b'{"kind": "\xff"}', 400, True),
    ("a list", lambda t: json_headers(t), b"[1]", 422, True),
    ("missing kind", lambda t: json_headers(t), body({"params": {}}), 422, True),
    ("unknown field", lambda t: json_headers(t), body({"kind": "fail", "priority": 1}), 422, True),
    ("unknown kind", lambda t: json_headers(t), body({"kind": "nope"}), 422, True),
    ("a kind that is not a string", lambda t: json_headers(t), body({"kind": 7}), 422, True),
    ("a bad param", lambda t: json_headers(t), body({"kind": "sleep", "params": {"seconds": "x"}}), 422, True),
    ("an unknown param", lambda t: json_headers(t), body({"kind": "sleep", "params": {"secs": 1}}), 422, True),
    ("params not an object", lambda t: json_headers(t), body({"kind": "sleep", "params": [1]}), 422, True),
    # Left to Quart, untouched: the fast path never interprets these.
    ("from a web page", lambda t: [*json_headers(t), ("Origin", "http://evil")], SLEEP, 403, False),
    ("chunked", lambda t: [*json_headers(t), ("Transfer-Encoding", "chunked")], SLEEP, 202, False),
]


def normalized(status: int, headers: list[tuple[bytes, bytes]], data: bytes) -> tuple[int, list[Any], Any]:
    """An answer with what differs per request replaced: the request id, and a new job's id."""
    request_id = dict(headers).get(b"x-request-id", b"").decode()
    named = [(k, b"<id>" if k == b"x-request-id" else v) for k, v in headers]
    payload = json.loads(data.replace(request_id.encode(), b"<id>")) if data else None
    if status == 202:
        assert re.fullmatch(r"[0-9a-f]{32}", payload["job_id"]), payload
        payload["job_id"] = "<job>"
    return status, named, payload


def of_exchange(exchange: Exchange) -> tuple[int, list[Any], Any]:
    return normalized(exchange.status, exchange.headers, exchange.body)


def of_answer(answer: Answer) -> tuple[int, list[Any], Any]:
    headers = [(k.encode(), v.encode()) for k, v in answer.headers.items() if k not in ("date", "server", "connection")]
    return normalized(answer.status, headers, answer.body)


def expected_position(status: int, exchange: Exchange) -> Any:
    """The twin of a job Quart's route queued gets the next position (the queue is paused)."""
    if status != 202:
        return None
    return json.loads(exchange.body)["queue_position"] + 1


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_the_fast_path_answers_exactly_as_quarts_route(open_harness: OpenHarness, case: Case) -> None:
    name, make_headers, data, status, handled = case
    async with open_harness(api_token=API_TOKEN) as harness:
        await harness.supervisor.pause()
        spy = Spy(fast_route(harness.app))
        quart_only = create_app(harness.supervisor, fast_routes=False)
        chunked = name == "chunked"
        async with quart_only.test_app():
            by_quart = await asgi_post(quart_only, PATH, make_headers(API_TOKEN), data, with_length=not chunked)
            by_fast = await asgi_post(harness.app, PATH, make_headers(API_TOKEN), data, with_length=not chunked)
        assert by_quart.status == status, (by_quart, name)
        quart_status, quart_headers, quart_payload = of_exchange(by_quart)
        if status == 202:
            quart_payload["queue_position"] = expected_position(status, by_quart)
            quart_headers = [(k, v) for k, v in quart_headers if k != b"content-length"]
            fast_status, fast_headers, fast_payload = of_exchange(by_fast)
            assert (fast_status, fast_payload) == (quart_status, quart_payload)
            assert [h for h in fast_headers if h[0] != b"content-length"] == quart_headers
            # Both jobs are real rows, queued one after the other.
            rows, _ = await harness.supervisor.registry.list_jobs(status=JobStatus.QUEUED)
            queued = [j.job_id for j in rows]
            assert {json.loads(by_quart.body)["job_id"], json.loads(by_fast.body)["job_id"]} <= set(queued)
        else:
            assert of_exchange(by_fast) == (quart_status, quart_headers, quart_payload)
        assert spy.calls == (0 if handled else 1)
        # Each answer carries its own request id, and an error names it.
        request_id = dict(by_fast.headers)[b"x-request-id"].decode()
        assert re.fullmatch(r"[0-9a-f]{16}", request_id)
        if status >= 400:
            assert json.loads(by_fast.body)["error"]["request_id"] == request_id
        # The fast path checks the token before it reads the body (quart-trio's own task takes it regardless).
        if status == 401:
            assert not by_fast.body_read


async def test_a_server_without_an_api_token_takes_any_authorization(harness: Harness) -> None:
    await harness.supervisor.pause()
    for headers in (json_headers(None), json_headers("whatever"), [("Authorization", "Basic x"), *json_headers(None)]):
        answer = await asgi_post(harness.app, PATH, headers, SLEEP)
        assert answer.status == 202, answer
        job = await harness.supervisor.get(json.loads(answer.body)["job_id"])
        assert job.status is JobStatus.QUEUED


async def test_a_token_reloaded_from_its_file_is_the_one_the_fast_path_checks(harness: Harness, tmp_path: Path) -> None:
    """The API token is re-read from its file on SIGHUP (``ApiToken.reload``): the fast path asks the same source as
    Quart's hook, at each request."""
    await harness.supervisor.pause()
    path = tmp_path / "api.token"
    path.write_text("first-token-0123456789\n")
    token = ApiToken(None, path)
    token.reload()
    app = create_app(harness.supervisor, token)
    async with app.test_app():
        spy = Spy(fast_route(app))  # after the app's lifespan messages, which are Quart's
        assert (await asgi_post(app, PATH, json_headers("first-token-0123456789"), SLEEP)).status == 202
        path.write_text("second-token-0123456789\n")
        token.reload()
        assert (await asgi_post(app, PATH, json_headers("first-token-0123456789"), SLEEP)).status == 401
        assert (await asgi_post(app, PATH, json_headers("second-token-0123456789"), SLEEP)).status == 202
        assert spy.calls == 0


async def live_exchange(live: Live, headers: list[tuple[str, str]], data: bytes, *, chunked: bool) -> Answer:
    client = await connect(live)
    async with client.stream:
        sent = request_bytes(PATH, headers, data, chunked=chunked)
        # A body the server refuses unread is not sent whole: the answer comes before its end, so it closes the
        # connection. Any other request arrives whole, and its connection is kept.
        cut = len(data) > MAX_BODY_BYTES
        await client.send(sent[: len(sent) - len(data) + 1024] if cut else sent)
        answer = await client.answer()
        assert answer.closes == cut, answer.headers
        if cut:
            await client.closed_by_server()
    return answer


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_a_live_servers_answer_is_quarts_route_answer(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    name, make_headers, data, status, handled = case
    live = await make_live(api_token=API_TOKEN)
    await live.supervisor.pause()
    spy = LiveSpy(monkeypatch)
    chunked = name == "chunked"
    quart_only = create_app(live.supervisor, fast_routes=False)
    async with quart_only.test_app():
        by_quart = await asgi_post(quart_only, PATH, make_headers(API_TOKEN), data, with_length=not chunked)
    answer = await live_exchange(live, make_headers(API_TOKEN), data, chunked=chunked)
    assert by_quart.status == status
    quart_status, quart_headers, quart_payload = of_exchange(by_quart)
    got_status, got_headers, got_payload = of_answer(answer)
    if status == 202:
        quart_payload["queue_position"] = expected_position(status, by_quart)
        quart_headers = [(k, v) for k, v in quart_headers if k != b"content-length"]
        got_headers = [(k, v) for k, v in got_headers if k != b"content-length"]
    assert (got_status, got_payload) == (quart_status, quart_payload)
    assert sorted(got_headers) == sorted(quart_headers)
    assert spy.calls == (1 if handled else 0)


async def test_enqueues_back_to_back_on_one_connection_run_in_order(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = await make_live()
    spy = LiveSpy(monkeypatch)
    client = await connect(live)
    headers = json_headers(None)
    async with client.stream:
        # Pipelined: every request is on the wire before the first answer is read.
        await client.send(
            b"".join(
                request_bytes(PATH, headers, body({"kind": "echo", "params": {"text": f"n{n}"}}), chunked=False)
                for n in range(20)
            )
        )
        answers = [await client.answer() for _ in range(20)]
    assert [a.status for a in answers] == [202] * 20
    assert not any(a.closes for a in answers)
    assert spy.calls == 20
    jobs = [await wait_terminal(live.supervisor, json.loads(a.body)["job_id"]) for a in answers]
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 20
    assert [j.params for j in jobs] == [{"text": f"n{n}"} for n in range(20)]
