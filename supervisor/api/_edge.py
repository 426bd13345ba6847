"""The HTTP/1.1 edge: how a connection ends. Subclasses of hypercorn's h11 protocol and trio connection task,
installed by ``_serve.serve_http``.

Why it exists (hypercorn 0.18, trio worker, with quart-trio). hypercorn does its per-connection bookkeeping inside
the app's own ``send()`` call: the ASGI message that ends a response makes the protocol close the request stream
(putting ``http.disconnect`` in the app's receive queue) and then, in the same call and the same task, either
recycle the connection for the next request (restart the keep-alive timer) or close the socket. quart-trio cancels
its request nursery as soon as it receives ``http.disconnect`` -- which hypercorn delivered a moment earlier -- so
that bookkeeping runs in a cancelled task and stops at its first checkpoint:

- a connection that must close (``Connection: close``, HTTP/1.0, an answer sent before the request body was read:
  401/405/413/415/408) is never closed; bytes that follow are parsed until h11 pauses for a recycle that never comes;
  the socket then sits in CLOSE-WAIT once the client gives up (ADR 0019; items 5 and 9 of
tests/api/test_api_hostile.py); - a kept-alive connection never restarts its idle timer, so ``keep_alive_timeout`` never
applies after the first request (idle clients hold connections, and a graceful stop waits for ``graceful_timeout``).

The fix here: that bookkeeping runs shielded from the app's cancellation. It is bounded: closing a socket and
restarting a timer never block, and the one queue put (``http.disconnect``) is read by quart-trio's message task,
which runs until it gets exactly that message. The upstream report is ``docs/upstream/hypercorn-keepalive.md``.

Also here, for the same edge:

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
  client that reads nothing cannot hold a request, or a graceful stop, forever;
- one error boundary per connection (``EdgeTCPServer.run``): whatever a connection raises ends that connection, is
  logged once (``http_connection_failed``) and counted, and never leaves its task, where it would end
  ``trio.serve_listeners`` and every other connection with it (the class of pgjones/hypercorn#203). The failure met
  was a write racing hypercorn's ``send_eof`` (which it makes outside its ``send_lock``): trio's
  ``BusyResourceError``, now taken as the connection closing;
- bounds no client can get around (``EdgeState``, from ``HttpLimits``): connections open at once (one more is
  answered 503 with ``Retry-After`` and closed), the bytes of answers written and not yet taken (a large write past
  the budget is cut), and a write that moves no byte for ``write_stall_timeout_s`` (cut).

Nothing here parses a request or answers one that h11 accepted: h11 is the server's only parser of request bytes, and
every request reaches the app through hypercorn's own stream.

hypercorn looks both classes up by name (``hypercorn.protocol.H11Protocol`` for each connection,
``hypercorn.trio.run.TCPServer`` when it starts serving); ``install()`` points those names at the subclasses, for
the whole process (the asyncio worker, which this project does not use, would break on their trio calls). They
override and call hypercorn internals, private or undocumented: the methods ``H11Protocol.handle``, ``stream_send``,
``_send_error_response``, ``_check_protocol`` and ``_send_h11_event`` and its attributes ``connection``, ``config``,
``client`` and ``send``; the method ``TCPServer.protocol_send`` and its attributes ``stream``, ``send_lock`` and
``protocol``; the events of ``hypercorn.events`` and ``hypercorn.protocol.events``. Of h11 they use only its public
API. ``pyproject.toml`` caps hypercorn below 0.19 and ``constraints.txt`` pins it; ``tests/api/test_http_edge.py``
exercises each case over a raw socket (most of them fail without ``install()``), so an upgrade that changes these
internals fails there.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

import h11
import hypercorn.protocol
import hypercorn.trio.run
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, RawData, Updated
from hypercorn.protocol.events import Response, StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..observe import get_logger
from ._app import REQUEST_ID_HEADER
from ._limits import HttpLimits

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


# How long a refused connection's client is told to wait, and how long its request is read (and thrown away) after
# the answer, so that closing does not reset the connection before the client has read the 503.
REFUSED_RETRY_AFTER_S = 1
REFUSED_DRAIN_S = 1.0
# How long /api/health says degraded after the HTTP server was restarted.
RESTART_SHOWN_S = 60.0


class EdgeState:
    """One server's edge: its bounds (from ``HttpLimits``) and what they did, as ``/metrics`` shows it (a collector
    of the supervisor's metrics registry). Shared by every connection of the server; only its event loop touches it."""

    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.open_connections = 0
        self.unsent_bytes = 0  # answers' bytes in writes under way
        self.refused = 0  # connections answered 503 for the connection bound
        self.failures = 0  # connections ended by an error of their own (the error boundary)
        self.cut = {"over_budget": 0, "stalled": 0}  # answers cut, by why
        self.server_restarts = 0  # the HTTP server started again after it ended by itself (_serve)
        self.serving = False  # the server listens and answers now
        self.last_restart: tuple[float, str] | None = None  # (trio time, why) of the last restart

    def restarted(self, failure: BaseException | None) -> None:
        self.server_restarts += 1
        why = f"{type(failure).__name__}: {failure}" if failure is not None else "it returned"
        self.last_restart = (trio.current_time(), why)

    def condition(self) -> str | None:
        """What ``/api/health`` says of the HTTP server: degraded while it is not serving, and for a while after it
        was restarted (a request that waited through the restart sees why); None when all is well."""
        if not self.serving:
            return "the HTTP server is restarting"
        if self.last_restart is None or trio.current_time() - self.last_restart[0] >= RESTART_SHOWN_S:
            return None
        return f"the HTTP server was restarted ({self.server_restarts} in all) after it ended: {self.last_restart[1]}"

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("podcast_http_connections", "HTTP connections open now.", value=self.open_connections)
        yield CounterMetricFamily(
            "podcast_http_connections_refused",
            "Connections answered 503 because max_connections were open.",
            value=self.refused,
        )
        yield CounterMetricFamily(
            "podcast_http_connection_failures",
            "Connections ended by an error of their own (logged http_connection_failed); the server went on.",
            value=self.failures,
        )
        cut = CounterMetricFamily(
            "podcast_http_answers_cut",
            "Answers cut and their connection closed: over the unsent-bytes budget, or a write that moved no byte.",
            labels=["why"],
        )
        for why, n in sorted(self.cut.items()):
            cut.add_metric([why], n)
        yield cut
        yield CounterMetricFamily(
            "podcast_http_server_restarts",
            "Times the HTTP server was started again after it ended by itself (logged http_server_restarted).",
            value=self.server_restarts,
        )


class EdgeConfig(HypercornConfig):
    """hypercorn's config, carrying the edge's state to each connection task (hypercorn hands every ``TCPServer`` its
    config): per server, no process-wide state."""

    def __init__(self, edge: EdgeState) -> None:
        super().__init__()
        self.edge = edge


def _has_connection_close(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        name.lower() == b"connection" and b"close" in (token.strip() for token in value.lower().split(b","))
        for name, value in headers
    )


class EdgeH11Protocol(H11Protocol):
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

    async def _send_h11_event(self, event: Any) -> None:
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError as exc:
            if self.connection.their_state == h11.ERROR:
                return  # as hypercorn: the client broke the protocol first, and the connection is closing
            # Our side cannot go on with this connection (a message that does not fit where the last one left it):
            # end this connection, never the server -- an exception here would leave the connection task and
            # stop every other connection with it.
            log.error("http_connection_abandoned", error=str(exc), client=_peer(self.client))
            await self.send(Closed())
            return
        await self.send(RawData(data=data))

    async def _check_protocol(self, event: h11.Request) -> None:
        # Never switch to HTTP/2 (h2c upgrade or prior-knowledge preface): see the module docstring.
        return None


def _peer(client: tuple[str, int] | None) -> str | None:
    return f"{client[0]}:{client[1]}" if client else None


class EdgeTCPServer(TCPServer):
    """hypercorn's trio connection task, with an error boundary, the connection bound, and writes that a cancel, a
    stall or the unsent-bytes budget can stop."""

    @property
    def _edge(self) -> EdgeState:
        config = self.config
        assert isinstance(config, EdgeConfig), "serve with an EdgeConfig (_serve.hypercorn_config)"
        return config.edge

    async def run(self) -> None:
        edge = self._edge
        if edge.open_connections >= edge.limits.max_connections:
            edge.refused += 1
            await self._refuse()
            return
        edge.open_connections += 1
        try:
            await super().run()
        except Exception as exc:
            # The connection's error boundary: whatever it raised ends it, never the server (its task would end
            # trio.serve_listeners and every other connection). Logged once, counted; the stream is closed by
            # serve_listeners' handler wrapper.
            self._failed(exc)
        except BaseExceptionGroup as group:
            # A connection's error while the server is being cancelled: the error is this connection's, the
            # cancellation goes on.
            cancelled, errors = group.split(trio.Cancelled)
            if errors is not None:
                self._failed(errors)
            if cancelled is not None:
                raise cancelled from None
            raise
        finally:
            edge.open_connections -= 1

    def _failed(self, exc: BaseException) -> None:
        self._edge.failures += 1
        client = getattr(getattr(self, "protocol", None), "client", None)
        log.error(
            "http_connection_failed",
            error=f"{type(exc).__name__}: {exc}",
            client=_peer(client) if isinstance(client, tuple) else None,
            effect="this connection is closed; the server and every other connection go on",
            exc_info=exc,
        )

    async def _refuse(self) -> None:
        """Answer 503 without reading the request (no parser runs: the bytes are fixed), then read and drop what the
        client sends for a moment, so that the close does not reset the connection before the 503 is read."""
        request_id = secrets.token_hex(8)
        body = json.dumps(
            {
                "error": {
                    "code": "too_many_connections",
                    "message": f"the server has {self._edge.limits.max_connections} connections open; retry later",
                    "field": None,
                    "request_id": request_id,
                }
            }
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
            f"retry-after: {REFUSED_RETRY_AFTER_S}\r\n"
            f"{REQUEST_ID_HEADER.lower()}: {request_id}\r\n"
            "connection: close\r\n\r\n"
        ).encode()
        try:
            with trio.move_on_after(REFUSED_DRAIN_S):
                await self.stream.send_all(head + body)
                await self.stream.send_eof()
                while await self.stream.receive_some(64 * 1024):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(self.stream)

    async def protocol_send(self, event: Any) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        # hypercorn writes under a shield, so that a cancelled request never leaves half a message on a connection
        # that goes on. But then a client that stops reading holds the write forever: the request task, the
        # connection, and a graceful stop, which waits for it (a few thousand pipelined GET /api/health unread are
        # enough). Here a write can be cancelled -- by the app's response timeout or the graceful stop -- and a cut
        # write ends the connection instead, which is what the shield was protecting.
        edge, data = self._edge, event.data
        size = len(data)
        async with self.send_lock:
            if size > edge.limits.small_write_bytes and edge.unsent_bytes + size > edge.limits.max_unsent_answer_bytes:
                # Answers not taken by their clients already hold the budget: this one is not added to them.
                await self._cut("over_budget", size)
                return
            edge.unsent_bytes += size
            try:
                await self._send_in_pieces(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
                # Busy: hypercorn's _close (send_eof, outside send_lock) is closing this stream meanwhile.
                await self.protocol.handle(Closed())
            except trio.TooSlowError:
                await self._cut("stalled", size)
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    await self.stream.aclose()
                    # The protocol learns the connection is gone, as for a broken write: its stream is closed, so
                    # the request's end sends nothing more. (Otherwise a write cut inside a response's head left h11
                    # in SEND_BODY while the stream still thought no response had begun, and its "500 instead"
                    # raised out of the connection task and stopped the server.)
                    await self.protocol.handle(Closed())
                raise
            finally:
                edge.unsent_bytes -= size

    async def _send_in_pieces(self, data: bytes) -> None:
        """Write ``data``; a piece the client does not take within ``write_stall_timeout_s`` raises TooSlowError."""
        view, limits = memoryview(data), self._edge.limits
        piece = limits.small_write_bytes
        for start in range(0, len(view), piece):
            with trio.fail_after(limits.write_stall_timeout_s):
                await self.stream.send_all(view[start : start + piece])

    async def _cut(self, why: str, size: int) -> None:
        self._edge.cut[why] += 1
        log.warning(
            "http_answer_cut",
            why=why,
            bytes=size,
            client=_peer(self.protocol.client) if isinstance(self.protocol.client, tuple) else None,
        )
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
            await self.protocol.handle(Closed())


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
