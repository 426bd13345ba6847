"""The heartbeat answered by the server's own HTTP/1.1 protocol, over real sockets, by either of its two ways: read
ahead of h11 (``EdgeH11Protocol.answer_plain``, a plain head in printable ASCII) or through h11
(``_http_edge.DirectStream``, a head h11 reads and the plain reader leaves: here one with a non-ASCII header value).

A live server (hypercorn + quart-trio on port 0) gets each request of ``test_api_heartbeat_route``'s table as raw
bytes, both ways; its answer must be Quart's own route's answer to the same request (asked through the ASGI app over
the same supervisor): status, the app's headers and body, the request id aside. The wire adds what the HTTP stack
adds to every answer (``date``, ``server``) and, for an answer sent before the body's end, ``Connection: close``,
which the connection then honours. A spy on both ways shows which requests took which.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import hypercorn.config
import pytest
import trio
from api_support import Live, MakeLive, wait_log_line
from hypercorn.protocol.events import Response
from structlog.testing import capture_logs
from test_api_heartbeat_route import CASES, Case, asgi_post, body, json_headers
from test_http_edge import EXCHANGE_S, HEALTH, HOST, Answer, Raw, connect

from supervisor import _app
from supervisor._app import StreamBody, create_app
from supervisor._http_edge import DirectStream, EdgeH11Protocol

# Added by the HTTP stack to every answer, whichever path made it.
_STACK_HEADERS = {"date", "server", "connection"}


# A header the plain reader leaves to h11 (a value with a byte outside ASCII) and h11 and the fast route accept: it
# sends a request the other way.
THROUGH_H11 = ("X-Note", "caf\xe9")
WAYS = ("read ahead of h11", "through h11")


class DirectSpy:
    """Counts the requests the protocol answered itself: ``ahead`` read ahead of h11, ``direct`` through h11."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ahead = 0
        self.direct = 0
        original_start = DirectStream.start
        original_answer = EdgeH11Protocol._answer_plain

        def start(stream: DirectStream, nursery: trio.Nursery) -> None:
            self.direct += 1
            original_start(stream, nursery)

        async def answer(protocol: EdgeH11Protocol, *args: Any) -> bool:
            self.ahead += 1
            return await original_answer(protocol, *args)

        monkeypatch.setattr(DirectStream, "start", start)
        monkeypatch.setattr(EdgeH11Protocol, "_answer_plain", answer)

    @property
    def calls(self) -> int:
        return self.ahead + self.direct

    def took(self, way: str) -> tuple[int, int]:
        """(ahead, direct) as one request the protocol answered itself ``way`` counts them."""
        return (1, 0) if way == WAYS[0] else (0, 1)


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


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_the_protocols_own_answer_is_quarts_route_answer(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, case: Case, way: str
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
        extra = [THROUGH_H11] if way == WAYS[1] else []
        sent = request_bytes(path, make_headers(token) + extra, data, chunked=chunked)
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
    assert (spy.ahead, spy.direct) == (spy.took(way) if handled else (0, 0))
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
    headers = json_headers(token)
    path = f"/api/jobs/{job_id}/heartbeat"
    async with client.stream:
        # Pipelined: every request is on the wire before the first answer is read.
        await client.send(
            b"".join(request_bytes(path, headers, body({"completed_units": n}), chunked=False) for n in range(50))
        )
        answers = [await client.answer() for _ in range(50)]
        assert [a.status for a in answers] == [204] * 50
        assert not any(a.closes for a in answers)
    assert (spy.ahead, spy.direct) == (50, 0)  # whole requests in one read: each read ahead of h11, in turn
    assert (await live.supervisor.get(job_id)).completed_units == 49


@pytest.mark.parametrize("way", WAYS)
async def test_a_client_gone_in_the_middle_of_a_body_leaves_the_server_serving(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    monkeypatch.setattr(_app, "BODY_TIMEOUT_S", 30)  # far beyond this test: only the client's leaving ends it
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    headers = json_headers(token)
    headers += [THROUGH_H11] if way == WAYS[1] else []
    path = f"/api/jobs/{job_id}/heartbeat"
    for _ in range(3):
        client = await connect(live)
        async with client.stream:
            await client.send(request_bytes(path, headers, body({"completed_units": 7}), chunked=False)[:-3])
        # The stream closed: the body's reader finds the end (ahead of h11), or the request's task is cancelled
        # (through h11); nothing is recorded.
    ahead, direct = spy.took(way)
    assert (spy.ahead, spy.direct) == (3 * ahead, 3 * direct)
    fresh = Raw(await trio.open_tcp_stream("127.0.0.1", int(live.url.rsplit(":", 1)[1])))
    async with fresh.stream:
        await fresh.send(request_bytes(path, headers, body({"completed_units": 2}), chunked=False))
        with trio.fail_after(EXCHANGE_S):
            assert (await fresh.answer()).status == 204
    assert (await live.supervisor.get(job_id)).completed_units == 2


@pytest.mark.parametrize("way", WAYS)
async def test_a_defect_while_answering_ends_that_connection_never_the_server(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    live = await make_live()
    job_id, token = await running_job(live)
    headers = json_headers(token)
    path = f"/api/jobs/{job_id}/heartbeat"
    if way == WAYS[0]:
        patched, original = "_plain_answer", EdgeH11Protocol._plain_answer

        def broken_plain(*args: Any) -> bytes:
            raise RuntimeError("a defect in the answer path")

        monkeypatch.setattr(EdgeH11Protocol, patched, broken_plain)
    else:
        headers.append(THROUGH_H11)
        patched, original = "stream_send", EdgeH11Protocol.stream_send

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
    monkeypatch.setattr(EdgeH11Protocol, patched, original)
    fresh = await connect(live)
    async with fresh.stream:
        await fresh.send(request_bytes(path, headers, body({"completed_units": 4}), chunked=False))
        assert (await fresh.answer()).status == 204


async def test_a_body_that_comes_after_its_head_is_read_ahead_of_h11(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    # httpx writes a request's head and its body separately: the reader ahead of h11 takes the head and waits for
    # the body on the same connection.
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    waiting = trio.Event()
    original = StreamBody.read_json

    async def read_json(stream_body: StreamBody) -> Any:
        if not stream_body.complete:
            waiting.set()
        return await original(stream_body)

    monkeypatch.setattr(StreamBody, "read_json", read_json)
    headers = json_headers(token)
    path = f"/api/jobs/{job_id}/heartbeat"
    data = body({"completed_units": 5})
    sent = request_bytes(path, headers, data, chunked=False)
    client = await connect(live)
    async with client.stream:
        await client.send(sent[: -len(data)])
        with trio.fail_after(EXCHANGE_S):
            await waiting.wait()
        await client.send(sent[-len(data) :])
        answer = await client.answer()
        assert (answer.status, answer.closes) == (204, False)
    assert (spy.ahead, spy.direct) == (1, 0)
    assert (await live.supervisor.get(job_id)).completed_units == 5


async def test_a_body_sent_a_few_bytes_at_a_time_is_read_whole_and_what_follows_it_is_the_next_request(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reader ahead of h11 gathers a body's pieces as they come, and the bytes after the body (here the next
    # request, in the same write as the body's last piece) are the next request, read ahead of h11 too.
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    headers = json_headers(token)
    path = f"/api/jobs/{job_id}/heartbeat"
    data = body({"completed_units": 5, "stage": "s" * 100})
    sent = request_bytes(path, headers, data, chunked=False)
    follow = request_bytes(path, headers, body({"completed_units": 6}), chunked=False)
    head, pieces = sent[: -len(data)], [data[i : i + 7] for i in range(0, len(data), 7)]
    client = await connect(live)
    async with client.stream:
        await client.send(head)
        for piece in pieces[:-1]:
            await client.send(piece)
            await trio.lowlevel.checkpoint()  # the server may read this piece on its own (order, not time)
        await client.send(pieces[-1] + follow)
        answers = [await client.answer() for _ in range(2)]
    assert [(a.status, a.closes) for a in answers] == [(204, False), (204, False)]
    assert (spy.ahead, spy.direct) == (2, 0)
    assert (await live.supervisor.get(job_id)).completed_units == 6


async def test_an_answer_before_the_body_closes_the_connection(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wrong token is answered at once (401), the body unread: what follows on the connection could be that body,
    # so it must never be read as a next request. The answer says Connection: close, and the server closes.
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    headers = json_headers(token + "x")
    path = f"/api/jobs/{job_id}/heartbeat"
    smuggled = request_bytes(path, json_headers(token), body({"completed_units": 9}), chunked=False)
    head = request_bytes(path, headers, b"x" * len(smuggled), chunked=False)[: -len(smuggled)]
    client = await connect(live)
    async with client.stream:
        await client.send(head)
        answer = await client.answer()
        assert (answer.status, answer.closes) == (401, True)
        with contextlib.suppress(trio.BrokenResourceError):
            await client.send(smuggled)  # the "body": a whole heartbeat, which must not be taken as one
        await client.closed_by_server()
    assert (spy.ahead, spy.direct) == (1, 0)
    assert (await live.supervisor.get(job_id)).completed_units == 0


async def test_a_plain_request_and_another_in_one_read_are_answered_in_order(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    headers = json_headers(token)
    beat = request_bytes(f"/api/jobs/{job_id}/heartbeat", headers, body({"completed_units": 1}), chunked=False)
    client = await connect(live)
    async with client.stream:
        await client.send(beat + HEALTH + beat)
        answers = [await client.answer() for _ in range(3)]
    assert [a.status for a in answers] == [204, 200, 204]
    assert json.loads(answers[1].body)["status"] == "ok"
    # The first beat is read ahead of h11; the rest of that read goes to h11 (the health check, to Quart), and the
    # last beat, which came in the same read, through h11.
    assert (spy.ahead, spy.direct) == (1, 1)


# Heads the reader ahead of h11 must leave to h11, whatever they hold: each is answered as h11 and the routes
# behind it answer it (the status here: h11 unfolds a folded header, sends a 100 first to an Expect, and hypercorn
# upper-cases a method and takes the path of an absolute target), never read ahead. ``{path}``, ``{auth}`` and
# ``{beat}`` are filled in.
LEFT_TO_H11: list[tuple[str, bytes, int]] = [
    ("space before a colon", b"POST {path} HTTP/1.1\r\nHost: s\r\n{auth}Content-Length : {n}\r\n\r\n{beat}", 400),
    (
        "folded header",
        b"POST {path} HTTP/1.1\r\nHost: s\r\n{auth}X-A: 1\r\n  2\r\nContent-Length: {n}\r\n\r\n{beat}",
        204,
    ),
    ("no Host", b"POST {path} HTTP/1.1\r\n{auth}Content-Length: {n}\r\n\r\n{beat}", 400),
    ("two Hosts", b"POST {path} HTTP/1.1\r\nHost: s\r\nHost: t\r\n{auth}Content-Length: {n}\r\n\r\n{beat}", 400),
    ("signed length", b"POST {path} HTTP/1.1\r\nHost: s\r\n{auth}Content-Length: +{n}\r\n\r\n{beat}", 400),
    (
        "two lengths",
        b"POST {path} HTTP/1.1\r\nHost: s\r\n{auth}Content-Length: {n}\r\nContent-Length: 1{n}\r\n\r\n{beat}",
        400,
    ),
    ("bare LF", b"POST {path} HTTP/1.1\nHost: s\n{auth_lf}Content-Length: {n}\n\n{beat}", 204),
    ("HTTP/1.0", b"POST {path} HTTP/1.0\r\nHost: s\r\n{auth}Content-Length: {n}\r\n\r\n{beat}", 204),
    ("a query", b"POST {path}?a=1 HTTP/1.1\r\nHost: s\r\n{auth}Content-Length: {n}\r\n\r\n{beat}", 204),
    (
        "Connection: close",
        b"POST {path} HTTP/1.1\r\nHost: s\r\nConnection: close\r\n{auth}Content-Length: {n}\r\n\r\n{beat}",
        204,
    ),
    (
        "Expect",
        b"POST {path} HTTP/1.1\r\nHost: s\r\nExpect: 100-continue\r\n{auth}Content-Length: {n}\r\n\r\n{beat}",
        100,
    ),
    ("lower-case method", b"post {path} HTTP/1.1\r\nHost: s\r\n{auth}Content-Length: {n}\r\n\r\n{beat}", 204),
    ("absolute form", b"POST http://s{path} HTTP/1.1\r\nHost: s\r\n{auth}Content-Length: {n}\r\n\r\n{beat}", 204),
    (
        "an Origin",
        b"POST {path} HTTP/1.1\r\nHost: s\r\nOrigin: http://evil\r\n{auth}Content-Length: {n}\r\n\r\n{beat}",
        403,
    ),
]


@pytest.mark.parametrize(("raw", "status"), [c[1:] for c in LEFT_TO_H11], ids=[c[0] for c in LEFT_TO_H11])
async def test_a_head_that_is_not_plain_is_left_to_h11(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch, raw: bytes, status: int
) -> None:
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    beat = body({"completed_units": 1})
    auth = f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n".encode()
    sent = (
        raw.replace(b"{path}", f"/api/jobs/{job_id}/heartbeat".encode())
        .replace(b"{auth}", auth)
        .replace(b"{auth_lf}", auth.replace(b"\r\n", b"\n"))
        .replace(b"{n}", str(len(beat)).encode())
        .replace(b"{beat}", beat)
    )
    client = await connect(live)
    async with client.stream:
        await client.send(sent)
        answer = await client.answer()
    assert answer.status == status
    assert spy.ahead == 0


async def test_a_connections_last_request_by_hypercorns_count_is_answered_with_close(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hypercorn ends a connection after keep_alive_max_requests requests (1,000 by default); read ahead of h11, the
    # count and the close are the same.
    monkeypatch.setattr(hypercorn.config.Config, "keep_alive_max_requests", 3)
    live = await make_live()
    job_id, token = await running_job(live)
    spy = DirectSpy(monkeypatch)
    headers = json_headers(token)
    path = f"/api/jobs/{job_id}/heartbeat"
    client = await connect(live)
    async with client.stream:
        await client.send(
            b"".join(request_bytes(path, headers, body({"completed_units": n}), chunked=False) for n in range(5))
        )
        answers = [await client.answer() for _ in range(3)]
        assert [(a.status, a.closes) for a in answers] == [(204, False), (204, False), (204, True)]
        await client.closed_by_server()
    assert (spy.ahead, spy.direct) == (3, 0)
    assert (await live.supervisor.get(job_id)).completed_units == 2  # the two requests after the close: never read
