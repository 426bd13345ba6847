"""The HTTP edge under faults (ADR 0019): one connection's failure ends that connection, never the server; the server
itself is a supervised child, started again on the same socket; no client can take every connection.

Each case speaks bytes to ``run_supervisor`` on port 0 (hypercorn + quart-trio, as in production). The server runs in
the test's own nursery, so anything that ended it fails the test with the server's own error.
"""

from __future__ import annotations

import json
import random
from typing import Any

import hypercorn.trio.run
import pytest
import trio
from api_support import API_TOKEN, Live, MakeLive
from raw_http import EXCHANGE_S, Raw, connect

from supervisor.api import HttpLimits

BODY_TIMEOUT_S = 3.0
HOST = b"Host: supervisor\r\n"
TOKEN = b"Authorization: Bearer " + API_TOKEN.encode() + b"\r\n"
HEALTH = b"GET /api/health HTTP/1.1\r\n" + HOST + b"\r\n"


async def _health(live: Live) -> dict[str, Any]:
    client = await connect(live)
    async with client.stream:
        await client.send(HEALTH)
        answer = await client.answer()
        assert answer.status == 200
        return dict(answer.json())


async def _enqueue_once(live: Live, key: str) -> int:
    body = json.dumps({"kind": "sleep", "params": {"seconds": 0}}).encode()
    client = await connect(live)
    async with client.stream:
        await client.send(
            b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + b"Content-Type: application/json\r\n"
            b"Idempotency-Key: " + key.encode() + b"\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        return (await client.answer()).status


def _metric(text: str, name: str) -> float:
    [value] = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return value


async def _metrics(live: Live) -> str:
    with trio.fail_after(EXCHANGE_S):
        while True:  # a connection closed a moment ago is counted out once its task has ended: soon after
            client = await connect(live)
            async with client.stream:
                await client.send(b"GET /metrics HTTP/1.1\r\n" + HOST + b"\r\n")
                answer = await client.answer()
            if answer.status != 503:
                return answer.body.decode()


async def test_400_clients_hanging_up_around_the_body_timeout_leave_the_server_serving(make_live: MakeLive) -> None:
    """Each sends the head of an enqueue with ``Content-Length: 123`` and no body, and closes its connection within
    40 ms either side of the server's body timeout: the 408 being written meets the close. One such race raised
    ``BusyResourceError`` out of a connection task and ended the server with every connection. (The issue met it
    with 200 clients and a 10 s timeout; 400 at 3 s meet it on the old edge every time here, sooner.)"""
    live = await make_live(api_token=API_TOKEN, limits=HttpLimits(body_timeout_s=BODY_TIMEOUT_S))
    rng = random.Random(52)
    head = b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + b"Content-Type: application/json\r\n"
    head += b"Content-Length: 123\r\n\r\n"

    async def hang_up(offset_s: float) -> None:
        client = await connect(live)
        await client.send(head)
        await trio.sleep(BODY_TIMEOUT_S + offset_s)  # the hang-up's moment is the scenario, not a wait for an event
        await client.stream.aclose()

    with trio.fail_after(BODY_TIMEOUT_S + 20):
        async with trio.open_nursery() as clients:
            for _ in range(400):
                clients.start_soon(hang_up, rng.uniform(-0.04, 0.04))
    assert (await _health(live))["status"] == "ok"
    assert await _enqueue_once(live, "after-the-hang-ups") == 202


async def test_a_connections_own_error_ends_that_connection_is_logged_once_and_counted(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever a connection raises (here, a defect planted in the protocol for requests to one path) ends only that
    connection: the others, and the server, go on."""
    from hypercorn.protocol.h11 import H11Protocol

    original = H11Protocol._create_stream

    async def broken(self: Any, request: Any) -> None:
        if request.target == b"/boom":
            raise RuntimeError("a defect in the HTTP stack")
        await original(self, request)

    monkeypatch.setattr(H11Protocol, "_create_stream", broken)
    live = await make_live(api_token=API_TOKEN)
    keep = await connect(live)  # another client's kept-alive connection, open throughout
    await keep.send(HEALTH)
    assert (await keep.answer()).status == 200
    doomed = await connect(live)
    async with doomed.stream:
        await doomed.send(b"GET /boom HTTP/1.1\r\n" + HOST + b"\r\n")
        assert await doomed.closed_by_server() == b""
    await keep.send(HEALTH)  # the other connection was not touched
    assert (await keep.answer()).status == 200
    await keep.stream.aclose()
    assert (await _health(live))["status"] == "ok"
    assert _metric(await _metrics(live), "podcast_http_connection_failures_total") == 1
    out = capsys.readouterr().out
    assert out.count("http_connection_failed") == 1 and "a defect in the HTTP stack" in out


async def test_the_http_server_ended_by_itself_is_started_again_on_the_same_socket(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The API is a supervised child: if hypercorn's server ends for anything but the shutdown, the root starts it
    again on the same socket (a request sent meanwhile waits in the backlog), says so, and /api/health says degraded
    for a while; nothing else of the supervisor depended on it."""
    explode = trio.Event()
    runs = 0
    real = hypercorn.trio.run.worker_serve

    async def fragile(*args: Any, task_status: Any = trio.TASK_STATUS_IGNORED, **kwargs: Any) -> None:
        nonlocal runs
        runs += 1
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: real(*args, task_status=task_status, **kwargs))
            task_status.started()
            if runs == 1:
                await explode.wait()
                raise RuntimeError("the server's task group failed")

    monkeypatch.setattr(hypercorn.trio.run, "worker_serve", fragile)
    live = await make_live(api_token=API_TOKEN)
    assert (await _health(live))["status"] == "ok"
    explode.set()
    # Sent while the server restarts: it waits in the listening socket's backlog and is answered by the new run.
    with trio.fail_after(EXCHANGE_S):
        health = await _health(live)
    assert health["status"] == "degraded" and "restarted" in health["degraded"]["http"]
    assert runs == 2
    assert capsys.readouterr().out.count("http_server_restarted") == 1
    assert _metric(await _metrics(live), "podcast_http_server_restarts_total") == 1
    assert await _enqueue_once(live, "after-the-restart") == 202


async def test_connections_past_the_bound_are_answered_503_with_retry_after_and_closed(make_live: MakeLive) -> None:
    live = await make_live(api_token=API_TOKEN, limits=HttpLimits(max_connections=4))
    held: list[Raw] = []
    for _ in range(4):  # four clients keep a connection each (a kept-alive connection after one answer)
        client = await connect(live)
        await client.send(HEALTH)
        assert (await client.answer()).status == 200
        held.append(client)
    refused = await connect(live)
    async with refused.stream:
        await refused.send(HEALTH)
        answer = await refused.answer()
        assert answer.status == 503 and answer.headers["retry-after"] == "1"
        assert answer.json()["error"]["code"] == "too_many_connections"
        assert await refused.closed_by_server() == b""
    await held.pop().stream.aclose()
    with trio.fail_after(EXCHANGE_S):
        while True:  # the freed connection is counted out once its task has ended: soon after the close
            client = await connect(live)
            async with client.stream:
                await client.send(HEALTH)
                if (await client.answer()).status == 200:
                    break
    for client in held:
        await client.stream.aclose()
    # At least the one above, and any refused while the freed slot was counted out.
    assert _metric(await _metrics(live), "podcast_http_connections_refused_total") >= 1
