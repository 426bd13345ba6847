"""``POST /api/jobs``'s contract, request by request (Quart's route is the only dispatcher).

Every request of the table goes to the app as a raw ASGI call, and as raw bytes to a live server's socket, whose
answer must be the app's: status, headers and body, the request id and the new job's id aside (each answer has its
own). The queue is paused, so a job enqueued by one is still queued when the other enqueues its twin: both answers
name the position their job got. The server requires an API token, so the table covers the token before the body.
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
    CODES,
    NESTED,
    PLAIN,
    Exchange,
    asgi_post,
    body,
    json_headers,
    request_bytes,
)
from test_http_edge import Answer, connect

from supervisor.api import MAX_BODY_BYTES, create_app
from supervisor.domain import ApiToken, JobStatus, PageRequest

PATH = "/api/jobs"
SLEEP = body({"kind": "sleep", "params": {"seconds": 5}})

# (name, api token -> headers, body, expected status)
Case = tuple[str, Callable[[str], list[tuple[str, str]]], bytes, int]
CASES: list[Case] = [
    ("a job", lambda t: json_headers(t), SLEEP, 202),
    ("no params", lambda t: json_headers(t), body({"kind": "fail"}), 202),
    ("null params", lambda t: json_headers(t), body({"kind": "fail", "params": None}), 202),
    ("charset param", lambda t: json_headers(t, "Application/JSON; charset=utf-8"), SLEEP, 202),
    ("no token", lambda t: json_headers(None), SLEEP, 401),
    ("wrong token", lambda t: json_headers(t + "x"), SLEEP, 401),
    ("a job token's shape", lambda t: json_headers("0" * 64), SLEEP, 401),
    ("basic scheme", lambda t: [("Authorization", f"Basic {t}"), ("Content-Type", PLAIN)], SLEEP, 401),
    ("wrong token, bad JSON", lambda t: json_headers(t + "x"), b"{", 401),
    ("wrong token, too large", lambda t: json_headers("nope"), b" " * 70_000, 401),
    ("text/plain", lambda t: json_headers(t, "text/plain"), SLEEP, 415),
    ("no content type", lambda t: json_headers(t, None), SLEEP, 415),
    ("too large", lambda t: json_headers(t), b" " * 70_000, 413),
    ("bad JSON", lambda t: json_headers(t), b"{", 400),
    ("nested", lambda t: json_headers(t), NESTED, 400),
    ("NaN", lambda t: json_headers(t), b'{"kind": "sleep", "params": {"seconds": NaN}}', 400),
    ("not UTF-8", lambda t: json_headers(t), b'{"kind": "\xff"}', 400),
    ("a list", lambda t: json_headers(t), b"[1]", 422),
    ("missing kind", lambda t: json_headers(t), body({"params": {}}), 422),
    ("unknown field", lambda t: json_headers(t), body({"kind": "fail", "priority": 1}), 422),
    ("unknown kind", lambda t: json_headers(t), body({"kind": "nope"}), 422),
    ("a kind that is not a string", lambda t: json_headers(t), body({"kind": 7}), 422),
    ("a bad param", lambda t: json_headers(t), body({"kind": "sleep", "params": {"seconds": "x"}}), 422),
    ("an unknown param", lambda t: json_headers(t), body({"kind": "sleep", "params": {"secs": 1}}), 422),
    ("params not an object", lambda t: json_headers(t), body({"kind": "sleep", "params": [1]}), 422),
    ("from a web page", lambda t: [*json_headers(t), ("Origin", "http://evil")], SLEEP, 403),
    ("chunked", lambda t: [*json_headers(t), ("Transfer-Encoding", "chunked")], SLEEP, 202),
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
    """The twin of a job the app queued gets the next position (the queue is paused)."""
    if status != 202:
        return None
    return json.loads(exchange.body)["queue_position"] + 1


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_each_request_is_answered_by_the_routes_contract(open_harness: OpenHarness, case: Case) -> None:
    name, make_headers, data, status = case
    async with open_harness(api_token=API_TOKEN) as harness:
        await harness.supervisor.pause()
        answer = await asgi_post(harness.app, PATH, make_headers(API_TOKEN), data, with_length=name != "chunked")
        assert answer.status == status, (answer, name)
        rows, _ = await harness.supervisor.registry.list_jobs(PageRequest.parse(status=JobStatus.QUEUED))
        # Each answer carries its own request id, and an error names it.
        request_id = dict(answer.headers)[b"x-request-id"].decode()
        assert re.fullmatch(r"[0-9a-f]{16}", request_id)
        payload = json.loads(answer.body)
        if status == 202:
            assert [j.job_id for j in rows] == [payload["job_id"]]
            assert (payload["status"], payload["queue_position"], payload["coalesced"]) == ("queued", 1, False)
            return
        assert rows == [], "a refused request enqueues nothing"
        assert payload["error"]["request_id"] == request_id
        if status == 422:
            fields = ("body", "kind", "params", "priority", "params.seconds", "params.secs")
            assert payload["error"]["field"] in fields, payload
        else:
            assert payload["error"]["code"] == CODES[status]


async def test_a_server_without_an_api_token_takes_any_authorization(harness: Harness) -> None:
    await harness.supervisor.pause()
    for headers in (json_headers(None), json_headers("whatever"), [("Authorization", "Basic x"), *json_headers(None)]):
        answer = await asgi_post(harness.app, PATH, headers, SLEEP)
        assert answer.status == 202, answer
        job = await harness.supervisor.get(json.loads(answer.body)["job_id"])
        assert job.status is JobStatus.QUEUED


async def test_a_token_reloaded_from_its_file_is_the_one_checked(harness: Harness, tmp_path: Path) -> None:
    """The API token is re-read from its file on SIGHUP (``ApiToken.reload``): the hook asks it at each request."""
    await harness.supervisor.pause()
    path = tmp_path / "api.token"
    path.write_text("first-token-0123456789\n")
    token = ApiToken(None, path)
    token.reload()
    app = create_app(harness.supervisor, token)
    async with app.test_app():
        assert (await asgi_post(app, PATH, json_headers("first-token-0123456789"), SLEEP)).status == 202
        path.write_text("second-token-0123456789\n")
        token.reload()
        assert (await asgi_post(app, PATH, json_headers("first-token-0123456789"), SLEEP)).status == 401
        assert (await asgi_post(app, PATH, json_headers("second-token-0123456789"), SLEEP)).status == 202


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
async def test_a_live_servers_answer_is_the_apps_answer(make_live: MakeLive, case: Case) -> None:
    name, make_headers, data, status = case
    live = await make_live(api_token=API_TOKEN)
    await live.supervisor.pause()
    chunked = name == "chunked"
    app = create_app(live.supervisor, ApiToken(API_TOKEN))
    async with app.test_app():
        by_app = await asgi_post(app, PATH, make_headers(API_TOKEN), data, with_length=not chunked)
    answer = await live_exchange(live, make_headers(API_TOKEN), data, chunked=chunked)
    assert by_app.status == status
    app_status, app_headers, app_payload = of_exchange(by_app)
    got_status, got_headers, got_payload = of_answer(answer)
    if status == 202:
        app_payload["queue_position"] = expected_position(status, by_app)
        app_headers = [(k, v) for k, v in app_headers if k != b"content-length"]
        got_headers = [(k, v) for k, v in got_headers if k != b"content-length"]
    assert (got_status, got_payload) == (app_status, app_payload)
    assert sorted(got_headers) == sorted(app_headers)


async def test_enqueues_back_to_back_on_one_connection_run_in_order(make_live: MakeLive) -> None:
    live = await make_live()
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
    jobs = [await wait_terminal(live.supervisor, json.loads(a.body)["job_id"]) for a in answers]
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 20
    assert [j.params for j in jobs] == [{"text": f"n{n}"} for n in range(20)]
