"""The HTTP/1.1 edge: how a connection ends. Subclasses of hypercorn's h11 protocol and trio connection task,
installed by ``_server``.

Why it exists (hypercorn 0.18, trio worker, with quart-trio). hypercorn does its per-connection bookkeeping inside
the app's own ``send()`` call: the ASGI message that ends a response makes the protocol close the request stream
(putting ``http.disconnect`` in the app's receive queue) and then, in the same call and the same task, either
recycle the connection for the next request (restart the keep-alive timer) or close the socket. quart-trio cancels
its request nursery as soon as it receives ``http.disconnect`` -- which hypercorn delivered a moment earlier -- so
that bookkeeping runs in a cancelled task and stops at its first checkpoint:

- a connection that must close (``Connection: close``, HTTP/1.0, an answer sent before the request body was read:
  401/405/413/415/408) is never closed; bytes that follow are parsed until h11 pauses for a recycle that never comes;
  the socket then sits in CLOSE-WAIT once the client gives up (issue 9, items 5 and 9);
- a kept-alive connection never restarts its idle timer, so ``keep_alive_timeout`` never applies after the first
  request (idle clients hold connections, and a graceful stop waits for ``graceful_timeout``).

The fix here: that bookkeeping runs shielded from the app's cancellation. It is bounded: closing a socket and
restarting a timer never block, and the one queue put (``http.disconnect``) is read by quart-trio's message task,
which runs until it gets exactly that message. The upstream report is ``docs/upstream/hypercorn-keepalive.md``.

Also here, for the same edge:

- the two requests that come by thousands (a job's heartbeat, one job's enqueue) are answered without h11 when they
  are plain: a whole head in printable ASCII, one Host, one Content-Length, nothing that asks for more (an upgrade,
  an ``Expect``, a ``Connection`` other than keep-alive), on a connection with nothing in progress
  (``EdgeH11Protocol.answer_plain``). Anything else, byte for byte, goes to h11 as before. Read ahead this way, a
  heartbeat costs 40 % less CPU (issue 10; ``docs/performance.md``);
- an answer that starts while the request body is still unread carries ``Connection: close`` (and the connection
  really closes after it): the unread bytes must never be parsed as a next request;
- answers produced by the protocol itself (400 for malformed HTTP such as ``Content-Length: abc``, 431 for a head
  over ``h11_max_incomplete_size``, 501 for an unsupported transfer coding) follow the API's error format: a JSON
  body, ``X-Request-Id``, ``Connection: close``;
- the cleartext HTTP/2 upgrade (``Upgrade: h2c``, or the HTTP/2 preface) is not taken: every connection stays on
  this protocol, so these rules cover every connection. (No client of this API speaks HTTP/2; TLS is terminated by
  a reverse proxy, if any.)
- when the client closes, the keep-alive timer stops, so the server closes its side at once (not after
  ``keep_alive_timeout``, the socket in CLOSE-WAIT meanwhile);
- in the connection task (``EdgeTCPServer``): a write can be cancelled, and a cut write closes the connection, so a
  client that reads nothing cannot hold a request, or a graceful stop, forever; closing a socket is shielded.

hypercorn looks both classes up by name (``hypercorn.protocol.H11Protocol`` for each connection,
``hypercorn.trio.run.TCPServer`` when it starts serving); ``install()`` points those names at the subclasses, for
the whole process (the asyncio worker, which this project does not use, would break on their trio calls). They
touch private hypercorn members (``_send_error_response``, ``_check_protocol``, ``_send_h11_event``, ``_close``,
``stream``, ``send_lock``); ``constraints.txt`` pins hypercorn and ``tests/api/test_http_edge.py`` exercises each
case over a raw socket, so an upgrade that changes them fails there.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import h11
import hypercorn.protocol
import hypercorn.trio.run
import trio
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol.events import Body, EndBody, Response, StreamClosed
from hypercorn.protocol.h11 import STREAM_ID, H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

from ._app import (
    REQUEST_ID_HEADER,
    RESPONSE_TIMEOUT_S,
    BufferedBody,
    ClientGone,
    FastRoutes,
    PlainRequest,
    StreamBody,
)
from ._logging import get_logger

log = get_logger()

# What the protocol's own answers say: h11 gives a status hint, not a message fit for a client.
_PROTOCOL_ERRORS: dict[int, tuple[str, str]] = {
    400: ("bad_request", "the request is not valid HTTP/1.1"),
    431: ("request_header_fields_too_large", "the request line and headers are too large"),
    501: ("not_implemented", "the request's transfer coding is not supported"),
}


def protocol_error_body(status: int, request_id: str) -> bytes:
    """The API's error format (``{"error": {code, message, field, request_id}}``) for an answer of the protocol."""
    code, message = _PROTOCOL_ERRORS.get(status, (HTTPStatus(status).phrase.lower().replace(" ", "_"), ""))
    error = {"code": code, "message": message or HTTPStatus(status).phrase, "field": None, "request_id": request_id}
    return json.dumps({"error": error}).encode()


def _has_connection_close(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        name.lower() == b"connection" and b"close" in (token.strip() for token in value.lower().split(b","))
        for name, value in headers
    )


# The one request head the protocol answers without h11 (``EdgeH11Protocol.answer_plain``): ``POST`` of a fast route
# in HTTP/1.1, every header line ``token:value`` in printable ASCII (h11's grammar, narrowed: no obs-fold, no
# obs-text, no whitespace before the colon). A head this matches, h11 reads the same way; anything else goes to h11.
_PLAIN_HEAD = re.compile(
    rb"POST (/api/jobs(?:/[A-Za-z0-9._~-]+/heartbeat)?) HTTP/1\.1"
    rb"((?:\r\n[-!#$%&'*+.^_`|~0-9A-Za-z]+:[\t\x20-\x7e]*)*)"
)
# Headers that ask h11 or hypercorn for more than a plain request and answer (a connection's end, an upgrade, an
# interim 100, a body coding): requests that carry one go to h11 -- but for ``Connection: keep-alive``, which asks
# for what HTTP/1.1 does anyway (and httpx sends with every request).
_NOT_PLAIN_HEADERS = frozenset({b"connection", b"upgrade", b"expect", b"transfer-encoding", b"te", b"http2-settings"})


def take_plain_head(data: bytes, max_head: int) -> tuple[bytes, list[tuple[bytes, bytes]], bytes] | None:
    """The head at the start of ``data`` if it is a plain fast-route request's, whole: ``(path, headers, the bytes
    after the head)``, header names lowered and values stripped as h11 gives them; None for anything else (left to
    h11, as is a head not all here yet)."""
    end = data.find(b"\r\n\r\n", 0, max_head + 4)
    if end < 0:
        return None
    match = _PLAIN_HEAD.fullmatch(data, 0, end)
    if match is None:
        return None
    headers: list[tuple[bytes, bytes]] = []
    hosts = 0
    for line in match.group(2).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.lower(), value.strip(b" \t")
        if name in _NOT_PLAIN_HEADERS and not (name == b"connection" and value.lower() == b"keep-alive"):
            return None
        hosts += name == b"host"
        headers.append((name, value))
    if hosts != 1:
        return None  # h11 refuses an HTTP/1.1 request without exactly one Host (400)
    return match.group(1), headers, data[end + 4 :]


class EdgeH11Protocol(H11Protocol):
    _corked: list[bytes] | None = None  # set while send_answer gathers an answer's bytes

    async def handle(self, event: Any) -> None:
        await super().handle(event)
        if isinstance(event, Closed):
            # The client closed (or the connection is closing). hypercorn's connection task closes the socket only
            # once its task group is empty, and a running keep-alive timer is in that group: without this, the
            # socket sits in CLOSE-WAIT for up to keep_alive_timeout after every client that closes an idle
            # connection. Marking the connection busy stops that timer.
            await self.send(Updated(idle=False))

    async def stream_send(self, event: Any) -> None:
        if isinstance(event, Response) and event.status_code >= 200 and self._request_body_unread():
            # The rest of the body may be received already and not yet through h11: hypercorn's reading task hands
            # h11's events to the app one per scheduling turn (each put in the app's queue is a checkpoint), and an
            # app may answer without a turn (a 401 before reading the body). One turn lets the reader reach the end
            # of a body that is already here; one still on the wire stays unread.
            await trio.lowlevel.checkpoint()
        if (
            isinstance(event, Response)
            and event.status_code >= 200
            and self._request_body_unread()
            and not _has_connection_close(event.headers)
        ):
            event = Response(
                stream_id=event.stream_id,
                headers=[*event.headers, (b"connection", b"close")],
                status_code=event.status_code,
            )
        if isinstance(event, StreamClosed):
            # The end of a response: close the stream, then recycle or close the connection. This runs in the app's
            # task, which quart-trio cancels as soon as the stream's http.disconnect reaches it (see the module
            # docstring); shielded, it always finishes. Bounded: nothing in it waits on the client.
            with trio.CancelScope(shield=True):
                await super().stream_send(event)
            return
        await super().stream_send(event)

    async def send_answer(self, status: int, headers: list[tuple[bytes, bytes]], data: bytes) -> None:
        """A whole answer -- its head, body and end -- in one write: what ``stream_send`` does with the three
        events, the bytes h11 makes for them joined (one send and one checkpoint per answer instead of two; the
        direct answers are small and come by thousands a second)."""
        self._corked = []
        try:
            await self.stream_send(Response(stream_id=STREAM_ID, headers=headers, status_code=status))
            if data:
                await self.stream_send(Body(stream_id=STREAM_ID, data=data))
            await self.stream_send(EndBody(stream_id=STREAM_ID))
        finally:
            corked, self._corked = self._corked, None
        await self.send(RawData(data=b"".join(corked)))

    async def _send_h11_event(self, event: Any) -> None:
        if self._corked is None:
            await super()._send_h11_event(event)
            return
        try:  # as hypercorn's, with the bytes kept for send_answer's one write
            self._corked.append(self.connection.send(event))
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise

    def _request_body_unread(self) -> bool:
        """True while the client may still send body bytes of the current request (h11 has not seen its end)."""
        return isinstance(self.connection, h11.Connection) and self.connection.their_state is h11.SEND_BODY

    async def _send_error_response(self, status_code: int) -> None:
        # Called by hypercorn when h11 rejects what the client sent; the connection is closed right after.
        request_id = secrets.token_hex(8)
        body = protocol_error_body(status_code, request_id)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (REQUEST_ID_HEADER.lower().encode(), request_id.encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"connection", b"close"),
            *self.config.response_headers("h11"),
        ]
        log.info("http_protocol_error", request_id=request_id, status=status_code, client=_peer(self.client))
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

    async def _check_protocol(self, event: h11.Request) -> None:
        # Never switch to HTTP/2 (h2c upgrade or prior-knowledge preface): see the module docstring.
        return None

    async def _create_stream(self, request: h11.Request) -> None:
        direct = self._direct_stream(request)
        if direct is None:
            await super()._create_stream(request)
            return
        self.stream = direct  # type: ignore[assignment]
        direct.start(self.task_group._nursery)  # type: ignore[attr-defined]  # hypercorn's trio TaskGroup
        self.keep_alive_requests += 1
        await self.context.mark_request()

    async def answer_plain(self, data: bytes, receive: Callable[[], Awaitable[bytes]]) -> bytes | None:
        """Answer the plain fast-route requests at the start of ``data`` without h11 and hypercorn's stream machinery,
        reading their bodies with ``receive``; return the bytes left for h11 (``b""``: none), or None once the
        connection is closed.

        Why: with those requests back to back on a kept-alive connection, h11's parsing and hypercorn's events and
        stream around each one cost more CPU than the supervisor's own work (issue 10's heartbeat profile, and
        ``bench/http_floor.py``: an empty app on hypercorn costs 0.85 ms a request on a slow machine). Only a
        connection with nothing in progress (h11 between requests, nothing buffered) is taken, and only a request
        whose whole head is in ``data`` and is plain (``take_plain_head``, ``FastRoutes.plain_case``). The answer is
        ``FastRoutes.respond``'s, written as h11 writes it, with hypercorn's headers and keep-alive rules, and this
        module's: an answer given before the body is all read (401, 413, 415) carries ``Connection: close`` and the
        connection closes after it. It runs in the connection's reading task: the next request is read once this one
        is answered, as h11 would.
        """
        route = self._fast_routes()
        while data and route is not None and self._between_requests():
            taken = take_plain_head(data, self.config.h11_max_incomplete_size)
            if taken is None:
                break
            raw_path, headers, after_head = taken
            path = raw_path.decode("ascii")
            plain = route.plain_case(b"POST", path, headers)
            if plain is None:
                break  # not the plain case (an Origin, a second Content-Length): h11 and Quart take it
            body = StreamBody(after_head, plain.content_length, plain.content_type, receive)
            if not await self._answer_plain(route, plain, path, body):
                return None
            data = body.rest
        return data

    def _plain_answer(self, status: int, headers: list[tuple[bytes, bytes]], data: bytes, *, close: bool) -> bytes:
        """The answer's bytes as h11 writes them (no reason phrase; a 204 and every other answer here carry their
        Content-Length), with what hypercorn's ``stream_send`` adds: its own headers, and ``Connection: close`` on
        a connection's last answer."""
        headers = [*headers, *self.config.response_headers("h11")]
        if close:
            headers.append((b"connection", b"close"))
        head = b"".join(b"%s: %s\r\n" % header for header in headers)
        return b"HTTP/1.1 %d \r\n%s\r\n%s" % (status, head, data)

    def _fast_routes(self) -> FastRoutes | None:
        """The app's fast routes, if the app has them and the server's config lets them answer by path alone."""
        route = getattr(getattr(self.app, "app", None), "asgi_app", None)
        if not isinstance(route, FastRoutes) or self.config.root_path or self.config.server_names:
            return None
        return route

    def _between_requests(self) -> bool:
        connection = self.connection
        return (
            self.stream is None
            and isinstance(connection, h11.Connection)
            and connection.our_state is h11.IDLE
            and connection.their_state is h11.IDLE
            and not connection.trailing_data[0]
        )

    async def _answer_plain(self, route: FastRoutes, plain: PlainRequest, path: str, body: StreamBody) -> bool:
        """One plain request, answered; False once the connection is closed."""
        await self.send(Updated(idle=False))
        self.keep_alive_requests += 1
        await self.context.mark_request()
        try:
            status, headers, data = await route.respond(plain, body.read_json, path)
        except ClientGone:
            await self.send(Closed())  # nobody is left to answer
            return False
        # An answer before the body's end closes the connection (as ``stream_send`` does): the unread bytes must
        # never be read as a next request.
        last = self.keep_alive_requests >= self.config.keep_alive_max_requests or not body.complete
        with trio.move_on_after(RESPONSE_TIMEOUT_S) as scope:
            try:
                await self.send(RawData(data=self._plain_answer(status, headers, data, close=last)))
            except Exception:
                # A defect, as hypercorn treats an app's: logged, and this connection ends (never the server).
                log.exception("direct_answer_failed", path=path)
                await self.send(Closed())
                return False
        if scope.cancelled_caught or last or self.context.terminated.is_set():
            await self.send(Closed())
            return False
        await self.send(Updated(idle=True))
        return True

    def _direct_stream(self, request: h11.Request) -> DirectStream | None:
        """A heartbeat or an enqueue in the plain case, answered without an ASGI app around it; None for anything
        else."""
        route = self._fast_routes()
        if route is None:
            return None
        path = request.target.partition(b"?")[0]
        try:
            decoded = unquote(path.decode("ascii"))  # as hypercorn builds the ASGI scope's path
        except UnicodeDecodeError:
            return None
        plain = route.plain_case(request.method, decoded, request.headers)
        if plain is None:
            return None
        return DirectStream(self, route, plain, decoded)


class DirectStream:
    """One heartbeat or enqueue, answered by ``FastRoutes.respond`` in a task of its connection.

    What hypercorn does per request around an ASGI app -- the scope, a task with its memory channel, the message
    dicts, the send state machine -- was a third of a heartbeat's CPU (issue 10: at least 3,000 a second). This
    takes the events the protocol hands a stream (``handle``: the body's chunks, its end, the stream's close) and
    answers through the protocol's own ``stream_send``: the same answer, the same connection handling (an answer
    before the body's end closes the connection), the same timeouts. A client that goes away cancels it.
    """

    idle = False

    def __init__(self, protocol: EdgeH11Protocol, route: FastRoutes, plain: PlainRequest, path: str) -> None:
        self._protocol = protocol
        self._route = route
        self._plain = plain
        self._body = BufferedBody(plain.content_length, plain.content_type)
        self._path = path
        self._scope = trio.CancelScope()
        self._closing = False  # the answer is out: its own close must not cancel it

    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._run)

    async def handle(self, event: Any) -> None:
        if isinstance(event, Body):
            self._body.feed(bytes(event.data))
        elif isinstance(event, EndBody):
            self._body.complete.set()
        elif isinstance(event, StreamClosed) and not self._closing:
            self._scope.cancel()  # the client went away: nobody is left to answer

    async def _run(self) -> None:
        with self._scope:
            # A client that goes away is the stream's close, which cancels this scope (``handle``): the buffered body
            # never raises ClientGone, as the ASGI path's reader does.
            status, headers, data = await self._route.respond(self._plain, self._body.read_json, self._path)
            with trio.move_on_after(RESPONSE_TIMEOUT_S):
                try:
                    await self._protocol.send_answer(status, headers, data)
                    self._closing = True
                    await self._protocol.stream_send(StreamClosed(stream_id=STREAM_ID))
                except Exception:
                    # A defect, as hypercorn treats an app's: logged, and this connection ends (never the server).
                    log.exception("direct_answer_failed", path=self._path)
                    await self._protocol.send(Closed())


def _peer(client: tuple[str, int] | None) -> str | None:
    return f"{client[0]}:{client[1]}" if client else None


class _IdleTimer:
    """hypercorn's keep-alive timer (its ``SingleTask`` interface), as one task per connection whose deadline moves.

    hypercorn stops its timer when a request starts and restarts it when the answer is out, and a restart spawns a
    new task (``nursery.start``) behind a lock: with small requests back to back on a kept-alive connection that was
    a fifth of the server's CPU (issue 10's heartbeat profile). Here one watcher task per connection waits for the
    server's stop with a deadline: a restart moves the deadline to ``keep_alive_timeout`` from now, a stop to never;
    neither spawns anything. What it does is hypercorn's ``_idle_timeout``: an idle connection is closed when its
    deadline passes or, at once, when the server stops; a busy one is left to finish its request, and closed as soon
    as it is idle again if the server stopped meanwhile. ``close()`` ends the watcher with the connection.
    """

    def __init__(self, server: EdgeTCPServer) -> None:
        self._server = server
        self._deadline = math.inf  # busy until the first restart
        self._scope: trio.CancelScope | None = None  # the watcher's current wait
        self._life = trio.CancelScope()  # the watcher's whole life
        self._started = False

    async def restart(self, task_group: Any, action: Any) -> None:
        terminated = self._server.context.terminated
        self._move(trio.current_time() if terminated.is_set() else trio.current_time() + self._keep_alive())
        if not self._started:
            self._started = True
            task_group._nursery.start_soon(self._watch)

    async def stop(self) -> None:
        self._move(math.inf)

    def close(self) -> None:
        self._life.cancel()

    def _keep_alive(self) -> float:
        return float(self._server.config.keep_alive_timeout)

    def _move(self, deadline: float) -> None:
        self._deadline = deadline
        if self._scope is not None:
            self._scope.deadline = deadline

    async def _watch(self) -> None:
        terminated = self._server.context.terminated
        with self._life:
            while True:
                with trio.CancelScope(deadline=self._deadline) as self._scope:
                    if terminated.is_set():
                        await trio.sleep_forever()  # busy at a stop: wait until idle (the deadline becomes now)
                    else:
                        await terminated.wait()
                self._scope = None
                if self._deadline == math.inf:
                    continue  # busy: the stop (or nothing) woke it; a busy connection is never closed here
                if terminated.is_set() or trio.current_time() >= self._deadline:
                    with trio.CancelScope(shield=True):
                        await self._server._initiate_server_close()
                    return


class EdgeTCPServer(TCPServer):
    """hypercorn's trio connection task, with writes that a cancel can stop, a close that a cancel cannot, and a
    keep-alive timer that costs no task per request (``_IdleTimer``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_task: Any = _IdleTimer(self)

    async def _read_data(self) -> None:
        # The last thing the connection's task group runs: once it returns the connection is closed or closing, and
        # the group (which waits for its tasks) must not wait for the keep-alive watcher.
        try:
            if self.config.read_timeout is not None:
                await super()._read_data()
                return
            # hypercorn's loop, without the deadline-less cancel scope it enters around every read (no read timeout
            # is configured: idle connections are bounded by the keep-alive timer, bodies by the app).
            while True:
                try:
                    data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    break
                # Plain heartbeats and enqueues first (only in this loop: a server with a read timeout reads through
                # hypercorn's, and h11 takes everything).
                protocol = self.protocol.protocol
                if data and isinstance(protocol, EdgeH11Protocol):
                    rest = await protocol.answer_plain(bytes(data), self._receive_body)
                    if rest is None:
                        break  # closed while answering
                    if not rest:
                        continue  # every request in it answered
                    data = rest
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    break
            await self.protocol.handle(Closed())
        finally:
            self.idle_task.close()

    async def _receive_body(self) -> bytes:
        """The next bytes of a body that ``answer_plain`` reads; b"" once the client has closed or is gone."""
        try:
            return bytes(await self.stream.receive_some(MAX_RECV))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return b""

    async def protocol_send(self, event: Any) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        # hypercorn writes under a shield, so that a cancelled request never leaves half a message on a connection
        # that goes on. But then a client that stops reading holds the write forever: the request task, the
        # connection, and a graceful stop, which waits for it (a few thousand pipelined GET /api/health unread are
        # enough). Here a write can be cancelled -- by the app's response timeout or the graceful stop -- and a cut
        # write ends the connection instead, which is what the shield was protecting.
        if not event.data:
            # h11 turns the empty body and the end of a Content-Length response into no bytes; writing them would
            # only yield to the scheduler (twice per 204).
            return
        async with self.send_lock:
            try:
                await self.stream.send_all(event.data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    await self.stream.aclose()
                raise

    async def _close(self) -> None:
        # Closing never blocks; shielded, a graceful stop's cancel cannot skip it (the socket would stay open until
        # garbage collection, its client waiting on it).
        with trio.CancelScope(shield=True):
            await super()._close()


def install() -> None:
    """Make hypercorn use ``EdgeTCPServer`` and ``EdgeH11Protocol`` for every connection in this process (idempotent).

    hypercorn looks both names up in its modules each time it starts serving or accepts a connection.
    """
    _replace(hypercorn.protocol, "H11Protocol", H11Protocol, EdgeH11Protocol)
    _replace(hypercorn.trio.run, "TCPServer", TCPServer, EdgeTCPServer)


def _replace(module: Any, name: str, original: type, replacement: type) -> None:
    current = getattr(module, name)
    if current is replacement:
        return
    if current is not original:
        raise RuntimeError(f"{module.__name__}.{name} was already replaced by {current!r}")
    setattr(module, name, replacement)
