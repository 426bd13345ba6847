"""The heartbeat answered by the server's own HTTP/1.1 protocol (``_http_edge.DirectStream``), over real sockets.

A live server (hypercorn + quart-trio on port 0) gets each request of ``test_api_heartbeat_route``'s table as raw
bytes; its answer must be Quart's own route's answer to the same request (asked through the ASGI app over the same
supervisor): status, the app's headers and body, the request id aside. The wire adds what the HTTP stack adds to
every answer (``date``, ``server``) and, for an answer sent before the body's end, ``Connection: close``, which the
connection then honours. A spy on ``DirectStream.start`` shows which requests took that path.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from api_support import Live, MakeLive, wait_log_line
from hypercorn.protocol.events import Response
from structlog.testing import capture_logs
from test_api_heartbeat_route import CASES, Case, asgi_post, body
from test_http_edge import EXCHANGE_S, HOST, Answer, Raw, connect

from supervisor import _app
from supervisor._app import create_app
from supervisor._http_edge import DirectStream, EdgeH11Protocol

# Added by the HTTP stack to every answer, whichever path made it.
_STACK_HEADERS = {"date", "server", "connection"}


class DirectSpy:
    """Counts the heartbeats the protocol answered itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = DirectStream.start

        def start(stream: DirectStream, nursery: trio.Nursery) -> None:
            self.calls += 1
            original(stream, nursery)

        monkeypatch.setattr(DirectStream, "start", start)


def request_bytes(path: str, headers: list[tuple[str, str]], data: bytes, *, chunked: bool) -> bytes:
    head = f"POST {path} HTTP/1.1\r\n".encode() + HOST
    for name, value in headers:
        head += f"{name}: {value}\r\n".encode("latin-1")
    if chunked:
        return head + b"\r\n" + f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    return head + f"Content-Length: {len(data)}\r\n\r\n".encode() + data


def normalized(answer: Answer) -> tuple[int, dict[str, str], bytes]:
    request_id = answer.headers.get("x-request-id", "")
    headers = {k: ("<id>" if k == "x-request-id" else v) for k, v in answer.headers.items() if k not in _STACK_HEADERS}
    data = answer.body.replace(request_id.encode(), b"<id>") if request_id else answer.body
    return answer.status, headers, data


async def running_job(live: Live) -> tuple[str, str]:
    result = await live.supervisor.enqueue("tokened", {"seconds": 30.0})
    return result.job.job_id, await wait_log_line(live.supervisor, result.job.job_id)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_the_protocols_own_answer_is_quarts_route_answer(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, case: Case
) -> None:
    name, make_headers, data, status, handled = case
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
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
        cut = len(data) > _app.MAX_BODY_BYTES
        await client.send(sent[: len(sent) - len(data) + 1024] if cut else sent)
        answer = await client.answer()
        assert answer.closes == cut, (name, answer.headers)
        if cut:
            await client.closed_by_server()
    assert by_quart.status == status
    assert normalized(answer) == (by_quart.status, *normalized(_as_answer(by_quart))[1:])
    assert spy.calls == (1 if handled else 0)
    if status != 204:
        assert json.loads(answer.body)["error"]["request_id"] == answer.headers["x-request-id"]


def _as_answer(exchange: Any) -> Answer:
    return Answer(exchange.status, {k.decode(): v.decode() for k, v in exchange.headers}, exchange.body)


async def test_beats_back_to_back_on_one_connection_are_recorded_in_order(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    client = await connect(live)
    headers = [("Authorization", f"Bearer {token}"), ("Content-Type", "application/json")]
    path = f"/api/jobs/{job_id}/heartbeat"
    async with client.stream:
        # Pipelined: every request is on the wire before the first answer is read.
        await client.send(
            b"".join(request_bytes(path, headers, body({"completed_units": n}), chunked=False) for n in range(50))
        )
        answers = [await client.answer() for _ in range(50)]
        assert [a.status for a in answers] == [204] * 50
        assert not any(a.closes for a in answers)
    assert spy.calls == 50
    assert (await live.supervisor.get(job_id)).completed_units == 49


async def test_a_client_gone_in_the_middle_of_a_body_leaves_the_server_serving(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_app, "BODY_TIMEOUT_S", 30)  # far beyond this test: only the client's leaving ends it
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    headers = [("Authorization", f"Bearer {token}"), ("Content-Type", "application/json")]
    path = f"/api/jobs/{job_id}/heartbeat"
    for _ in range(3):
        client = await connect(live)
        async with client.stream:
            await client.send(request_bytes(path, headers, body({"completed_units": 7}), chunked=False)[:-3])
        # The stream closed; the request's task is cancelled, nothing is recorded.
    assert spy.calls == 3
    fresh = Raw(await trio.open_tcp_stream("127.0.0.1", int(live.url.rsplit(":", 1)[1])))
    async with fresh.stream:
        await fresh.send(request_bytes(path, headers, body({"completed_units": 2}), chunked=False))
        with trio.fail_after(EXCHANGE_S):
            assert (await fresh.answer()).status == 204
    assert (await live.supervisor.get(job_id)).completed_units == 2


async def test_a_defect_while_answering_ends_that_connection_never_the_server(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = await make_live()
    job_id, token = await running_job(live)
    headers = [("Authorization", f"Bearer {token}"), ("Content-Type", "application/json")]
    path = f"/api/jobs/{job_id}/heartbeat"
    original = EdgeH11Protocol.stream_send

    async def broken(protocol: EdgeH11Protocol, event: Any) -> None:
        if isinstance(event, Response):
            raise RuntimeError("a defect in the answer path")
        await original(protocol, event)

    monkeypatch.setattr(EdgeH11Protocol, "stream_send", broken)
    with capture_logs() as logs:
        client = await connect(live)
        async with client.stream:
            await client.send(request_bytes(path, headers, body({"completed_units": 3}), chunked=False))
            assert await client.closed_by_server() == b""  # no answer: the connection is ended
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["direct_answer_failed"]
    monkeypatch.setattr(EdgeH11Protocol, "stream_send", original)
    fresh = await connect(live)
    async with fresh.stream:
        await fresh.send(request_bytes(path, headers, body({"completed_units": 4}), chunked=False))
        assert (await fresh.answer()).status == 204
