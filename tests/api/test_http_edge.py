"""The HTTP edge over raw sockets: how a live server answers and ends connections that clients misuse.

Each case speaks bytes to ``run_supervisor`` on port 0 (hypercorn + quart-trio, as in production) and reads what comes
back. A connection the server must end is awaited until it really ends (EOF or reset), inside ``trio.fail_after``:
on a server that never closes, the test fails instead of hanging. Nothing here sleeps to wait for something.

The edge's timeouts (``KEEP_ALIVE_TIMEOUT_S``, ``BODY_TIMEOUT_S``, ``RESPONSE_TIMEOUT_S``) are shortened by the ``live``
fixture, so that a case that waits for one finishes quickly; the shutdown tests keep the production values. The
kernel's view of a connection (CLOSE-WAIT, bytes queued) is read from ``/proc/net/tcp`` and polled under a deadline,
since nothing signals it.

Why hypercorn needs help with all this: ``supervisor/api/_edge.py``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from api_support import API_TOKEN, Live, MakeLive, poll_until, wait_log_line
from hypercorn.events import Updated
from raw_http import EXCHANGE_S, Answer, Raw, connect, port_of

from supervisor.api import EdgeTCPServer, HttpLimits

KEEP_ALIVE_S = 0.5
BODY_TIMEOUT_S = 0.5
RESPONSE_TIMEOUT_S = 0.5

HOST = b"Host: supervisor\r\n"
TOKEN = b"Authorization: Bearer " + API_TOKEN.encode() + b"\r\n"
JSON = b"Content-Type: application/json\r\n"
HEALTH = b"GET /api/health HTTP/1.1\r\n" + HOST + b"\r\n"


SHORT = HttpLimits(
    keep_alive_timeout_s=KEEP_ALIVE_S, body_timeout_s=BODY_TIMEOUT_S, response_timeout_s=RESPONSE_TIMEOUT_S
)


@pytest.fixture
async def live(make_live: MakeLive) -> Live:
    return await make_live(api_token=API_TOKEN, limits=SHORT)


async def assert_healthy(live: Live) -> None:
    """A fresh connection still gets an answer: no edge case wedged the server."""
    client = await connect(live)
    async with client.stream:
        await client.send(HEALTH)
        assert (await client.answer()).status == 200


def assert_error_format(answer: Answer, status: int, code: str) -> None:
    assert answer.status == status
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == code
    assert error["request_id"] == answer.headers["x-request-id"]
    assert set(error) == {"code", "message", "field", "request_id"}


# -- early answers: the server answers before it has read the request body -------------------------------------

_BODY = b'{"kind":"x"}'  # 12 bytes
EARLY = {
    "401 without the token": (
        b"POST /api/jobs HTTP/1.1\r\n" + HOST + JSON + b"Content-Length: 12\r\n\r\n",
        401,
        "unauthorized",
    ),
    "401 on a heartbeat without its job's token (answered ahead of Quart)": (
        b"POST /api/jobs/some-job/heartbeat HTTP/1.1\r\n" + HOST + JSON + b"Authorization: Bearer nope\r\n"
        b"Content-Length: 12\r\n\r\n",
        401,
        "unauthorized",
    ),
    "405 on a route without that method": (
        b"PUT /api/health HTTP/1.1\r\n" + HOST + JSON + b"Content-Length: 12\r\n\r\n",
        405,
        "method_not_allowed",
    ),
    "413 for a declared length over the limit": (
        b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + JSON + b"Content-Length: 100000\r\n\r\n",
        413,
        "body_too_large",
    ),
    "415 for a body that is not JSON": (
        b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + b"Content-Type: text/plain\r\nContent-Length: 12\r\n\r\n",
        415,
        "unsupported_media_type",
    ),
}


@pytest.mark.parametrize("case", list(EARLY))
async def test_an_early_answer_closes_the_connection(live: Live, case: str) -> None:
    head, status, code = EARLY[case]
    client = await connect(live)
    async with client.stream:
        await client.send(head)
        answer = await client.answer()
        assert_error_format(answer, status, code)
        # The body was never read: its bytes must not be taken for a next request, so the connection ends.
        assert answer.closes
        await client.send(_BODY + HEALTH)
        assert await client.closed_by_server() == b""
    await assert_healthy(live)


@pytest.mark.parametrize("path", [b"/api/jobs", b"/api/jobs/some-job/heartbeat"])
async def test_an_answer_after_the_whole_body_keeps_the_connection(live: Live, path: bytes) -> None:
    """The same 401 with the body already sent: nothing is left unread, so the connection serves the next request."""
    client = await connect(live)
    async with client.stream:
        await client.send(b"POST " + path + b" HTTP/1.1\r\n" + HOST + JSON + b"Content-Length: 12\r\n\r\n" + _BODY)
        first = await client.answer()
        assert (first.status, first.closes) == (401, False)
        await client.send(HEALTH)
        assert (await client.answer()).status == 200


# -- the client asks for the connection to end -----------------------------------------------------------------


async def test_connection_close_is_honoured(live: Live) -> None:
    client = await connect(live)
    async with client.stream:
        await client.send(b"GET /api/health HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n")
        answer = await client.answer()
        assert (answer.status, answer.closes) == (200, True)
        assert await client.closed_by_server() == b""


async def test_an_http_1_0_request_ends_its_connection(live: Live) -> None:
    client = await connect(live)
    async with client.stream:
        await client.send(b"GET /api/health HTTP/1.0\r\n\r\n")
        answer = await client.answer()
        assert (answer.status, answer.closes) == (200, True)
        assert await client.closed_by_server() == b""


# -- slow and idle clients -------------------------------------------------------------------------------------


async def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(live: Live) -> None:
    client = await connect(live)
    async with client.stream:
        for _ in range(2):
            await client.send(HEALTH)
            assert (await client.answer()).status == 200
        # Now idle: the server ends it after KEEP_ALIVE_S (well within EXCHANGE_S).
        assert await client.closed_by_server() == b""


async def test_a_slow_request_head_is_cut_off(live: Live) -> None:
    client = await connect(live)
    async with client.stream:
        await client.send(b"GET /api/health HTTP/1.1\r\nHo")
        assert await client.closed_by_server() == b""


async def test_a_slow_request_head_on_a_kept_alive_connection_is_cut_off(live: Live) -> None:
    client = await connect(live)
    async with client.stream:
        await client.send(HEALTH)
        assert (await client.answer()).status == 200
        await client.send(b"GET /api/health HTTP/1.1\r\nHo")
        assert await client.closed_by_server() == b""


async def test_a_stalled_body_is_answered_408_and_the_connection_closed(live: Live) -> None:
    client = await connect(live)
    async with client.stream:
        await client.send(b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + JSON + b"Content-Length: 12\r\n\r\n{")
        answer = await client.answer()  # after BODY_TIMEOUT_S
        assert_error_format(answer, 408, "request_timeout")
        assert answer.closes
        await client.send(b'"kind":"x"}' + HEALTH)
        assert await client.closed_by_server() == b""
    await assert_healthy(live)


async def test_a_stalled_heartbeat_body_is_answered_408_and_the_connection_closed(live: Live) -> None:
    """The heartbeat's own path (ahead of Quart) bounds a body the same way, once the job's token is known good."""
    result = await live.supervisor.enqueue("tokened", {"seconds": 30.0})
    token = await wait_log_line(live.supervisor, result.job.job_id)
    head = (
        b"POST /api/jobs/" + result.job.job_id.encode() + b"/heartbeat HTTP/1.1\r\n" + HOST + JSON
        + b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: 21\r\n\r\n{"
    )  # fmt: skip
    client = await connect(live)
    async with client.stream:
        await client.send(head)
        answer = await client.answer()  # after BODY_TIMEOUT_S
        assert_error_format(answer, 408, "request_timeout")
        assert answer.closes
        await client.send(b'"completed_units":1}' + HEALTH)
        assert await client.closed_by_server() == b""
    await assert_healthy(live)


# -- answers of the HTTP stack itself: malformed requests ------------------------------------------------------

MALFORMED = {
    "a huge header": (b"GET /api/health HTTP/1.1\r\n" + HOST + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n", 431),
    "a huge URL": (b"GET /api/health?q=" + b"a" * 100_000 + b" HTTP/1.1\r\n" + HOST + b"\r\n", 431),
    "Content-Length: abc": (b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + JSON + b"Content-Length: abc\r\n\r\n", 400),
    "a garbage request line": (b"\x00\x01 nonsense\r\n\r\n", 400),
    "an unsupported transfer coding": (
        b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + JSON + b"Transfer-Encoding: gzip\r\n\r\n",
        501,
    ),
}
_MALFORMED_CODES = {400: "bad_request", 431: "request_header_fields_too_large", 501: "not_implemented"}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_request_gets_the_error_format_and_a_close(live: Live, case: str) -> None:
    request, status = MALFORMED[case]
    client = await connect(live)
    async with client.stream:
        await client.send(request)
        answer = await client.answer()
        assert_error_format(answer, status, _MALFORMED_CODES[status])
        assert answer.closes
        assert await client.closed_by_server() == b""
    await assert_healthy(live)


async def test_the_cleartext_http2_upgrade_is_not_taken(live: Live) -> None:
    """Every connection stays on the HTTP/1.1 protocol whose endings are tested here."""
    client = await connect(live)
    async with client.stream:
        await client.send(
            b"GET /api/health HTTP/1.1\r\n" + HOST + b"Connection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
        )
        answer = await client.answer()
        assert answer.status == 200
        assert answer.json()["status"] == "ok"


# -- after many abusive clients: no socket left half-closed, no descriptor leaked -------------------------------

READ = None  # a step: read the answer before going on
_ABUSE: list[list[bytes | None]] = [
    # Each send after the first waits until the server has read the one before, so that the server meets them one
    # by one: that is how a keep-alive client's later requests arrive.
    [EARLY["401 without the token"][0], READ, _BODY + HEALTH, HEALTH, HEALTH],
    [EARLY["415 for a body that is not JSON"][0], READ, _BODY + HEALTH],
    [b"GET /api/health HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n", READ, HEALTH],
    [b"GET /api/health HTTP/1.0\r\n\r\n", READ],
    [HEALTH + HEALTH, READ],
    [HEALTH, READ],
    [b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + JSON + b"Content-Length: 12\r\n\r\n{"],
    [b"POST /api/jobs HTTP/1.1\r\n" + HOST + JSON + b"Content-Length: 2\r\n\r\n{}garbage\r\n\r\n", READ],
    [MALFORMED["Content-Length: abc"][0], READ],
    [b"GET /api/health HTTP/1.1\r\nHo"],
]
TIME_WAIT, CLOSE_WAIT, LISTEN = 0x06, 0x08, 0x0A


def _tcp_table(port: int) -> list[tuple[int, int, int]]:
    """(state, peer port, bytes not yet read) of each socket whose local port is ``port``, from the kernel's table."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                unread = int(fields[4].split(":")[1], 16)
                rows.append((int(fields[3], 16), int(fields[2].rsplit(":", 1)[1], 16), unread))
    return rows


async def _poll(condition: Callable[[], bool]) -> None:
    """Wait (polling the kernel's tables, which signal nothing) until ``condition()`` holds, within EXCHANGE_S."""

    async def check() -> bool | None:
        return True if condition() else None

    await poll_until(check, limit_s=EXCHANGE_S)


async def _abuse(live: Live, steps: list[bytes | None]) -> None:
    port = port_of(live)
    client = await connect(live)
    client_port = client.stream.socket.getsockname()[1]

    def server_read_it() -> bool:
        return all(unread == 0 for _, peer, unread in _tcp_table(port) if peer == client_port)

    async with client.stream:
        for step in steps:
            if step is READ:
                await client.answer()
                continue
            await _poll(server_read_it)
            if not await client.send(step):
                break
    # Leaving the block closes the client's side; the server must close its own.


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue  # the descriptor of the listing itself, closed meanwhile
    return count


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the kernel's TCP table (Linux)")
async def test_abusive_clients_leave_no_socket_in_close_wait_and_no_descriptor_open(live: Live) -> None:
    await assert_healthy(live)
    port = port_of(live)
    await _poll(lambda: all(state in (LISTEN, TIME_WAIT) for state, _, _ in _tcp_table(port)))
    sockets_before = _open_sockets()

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            for steps in _ABUSE:
                nursery.start_soon(_abuse, live, steps)
    await assert_healthy(live)

    # Every client is gone. No server socket may wait in CLOSE-WAIT (the client closed, the server never did), and
    # every connection's descriptor is closed (a connection reset by its client leaves no CLOSE-WAIT, only the fd).
    await _poll(lambda: all(state != CLOSE_WAIT for state, _, _ in _tcp_table(port)))
    await _poll(lambda: _open_sockets() <= sockets_before)


ESTABLISHED = 0x01


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the kernel's TCP table (Linux)")
async def test_a_client_that_closes_an_idle_connection_is_met_at_once(
    make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes its side as soon as the client closes an idle kept-alive connection, not when the keep-alive
    timeout (here far longer than this test waits) ends it: no socket sits in CLOSE-WAIT meanwhile."""
    idle = trio.Event()  # the connection is idle: its keep-alive timer runs (nothing on the wire says so)
    original_send = EdgeTCPServer.protocol_send

    async def protocol_send(server: EdgeTCPServer, event: Any) -> None:
        await original_send(server, event)
        if isinstance(event, Updated) and event.idle:
            idle.set()

    monkeypatch.setattr(EdgeTCPServer, "protocol_send", protocol_send)
    live = await make_live(api_token=API_TOKEN, limits=HttpLimits(keep_alive_timeout_s=60))
    port = port_of(live)
    client = await connect(live)
    client_port = client.stream.socket.getsockname()[1]
    async with client.stream:
        await client.send(HEALTH)
        assert (await client.answer()).status == 200
        with trio.fail_after(EXCHANGE_S):
            await idle.wait()

    def server_closed() -> bool:
        # ESTABLISHED until the client's FIN arrives, CLOSE-WAIT until the server closes, then gone (or LAST-ACK).
        return all(peer != client_port or state not in (ESTABLISHED, CLOSE_WAIT) for state, peer, _ in _tcp_table(port))

    await _poll(server_closed)


# -- a client that stops reading ----------------------------------------------------------------------------------

UNREAD_ANSWERS = 1000  # ~13 MB of OpenAPI documents: far more than the kernel buffers between the two ends hold


async def _start_unread_flood(live: Live, nursery: trio.Nursery) -> Raw:
    """A client that asks for many large answers and reads none; returns once the server's writes are stuck."""
    request = b"GET /api/openapi.json HTTP/1.1\r\n" + HOST + TOKEN + b"\r\n"
    probe = await connect(live)
    async with probe.stream:
        await probe.send(request)
        answer = await probe.answer()
        assert answer.status == 200
    one_answer = len(answer.body)
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, so the server fills it soon
    await sock.connect(("127.0.0.1", port_of(live)))
    client = Raw(trio.SocketStream(sock))
    client_port = sock.getsockname()[1]
    nursery.start_soon(client.send, request * UNREAD_ANSWERS)  # blocks once the server stops reading

    # The server's send queue tops out near its send buffer (about 18 KB here), which a whole answer may exceed (the
    # document grows with the kinds it describes): past this much, the client's small window is long full.
    stuck_at = min(one_answer, 8 * 1024)

    def server_stuck() -> bool:
        # More is queued than a client that reads nothing can take: the server is writing an answer that cannot end.
        return any(peer == client_port and queued > stuck_at for _, peer, queued in _tcp_send_queue(port_of(live)))

    await _poll(server_stuck)
    return client


def _tcp_send_queue(port: int) -> list[tuple[int, int, int]]:
    """(state, peer port, bytes sent but not yet acknowledged by the peer) of each socket on local port ``port``."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                queued = int(fields[4].split(":")[0], 16)
                rows.append((int(fields[3], 16), int(fields[2].rsplit(":", 1)[1], 16), queued))
    return rows


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the kernel's TCP table (Linux)")
async def test_a_client_that_stops_reading_is_cut_off_after_the_response_timeout(live: Live) -> None:
    async with trio.open_nursery() as nursery:
        client = await _start_unread_flood(live, nursery)
        async with client.stream:
            client_port = client.stream.socket.getsockname()[1]

            def server_closed() -> bool:
                rows = _tcp_send_queue(port_of(live))
                return all(peer != client_port or state != ESTABLISHED for state, peer, _ in rows)

            # Without reading: the server gives up on its stuck write and ends the connection.
            await _poll(server_closed)
            await assert_healthy(live)
            data = await client.closed_by_server()
            assert data.count(b"HTTP/1.1 200") < UNREAD_ANSWERS


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the kernel's TCP table (Linux)")
async def test_shutdown_is_bounded_with_a_client_that_stops_reading(make_live: MakeLive) -> None:
    """At production timeouts: a write stuck on a client that reads nothing does not hold a graceful stop."""
    live = await make_live(api_token=API_TOKEN)
    async with trio.open_nursery() as nursery:
        client = await _start_unread_flood(live, nursery)
        async with client.stream:
            started = trio.current_time()
            live.shutdown.set()
            bound = HttpLimits().graceful_timeout_s + 1.5
            with trio.fail_after(bound):
                await live.stopped.wait()
            assert trio.current_time() - started < bound


async def test_shutdown_is_bounded_with_slow_and_stalled_clients_held(make_live: MakeLive) -> None:
    """At production timeouts: a stop does not wait for the keep-alive or body timeouts of held connections."""
    live = await make_live(api_token=API_TOKEN)
    idle, slow_head, stalled = await connect(live), await connect(live), await connect(live)
    async with idle.stream, slow_head.stream, stalled.stream:
        await idle.send(HEALTH)
        assert (await idle.answer()).status == 200
        await slow_head.send(b"GET /api/health HTTP/1.1\r\nHo")
        await stalled.send(b"POST /api/jobs HTTP/1.1\r\n" + HOST + TOKEN + JSON + b"Content-Length: 12\r\n\r\n{")
        await assert_healthy(live)

        started = trio.current_time()
        live.shutdown.set()
        bound = HttpLimits().graceful_timeout_s + 1.5
        with trio.fail_after(bound):
            await live.stopped.wait()
        assert trio.current_time() - started < bound
        for client in (idle, slow_head, stalled):
            await client.closed_by_server()
