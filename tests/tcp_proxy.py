"""``TcpProxy``: a TCP proxy on 127.0.0.1 in front of a server, for the tests of what a client sees when the path to
its server fails (a module of ``tests/``, importable from every test directory). Each kind of failure is a subclass
that says when a new connection is let through (``admit``) and what happens between a read and its forwarding
(``hold``)."""

from __future__ import annotations

import random
import socket
import struct
from typing import Any

import trio

CONNECT_LIMIT_S = 10.0  # a backstop for an upstream that does not answer, never a timing assertion


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0  # where it listens, once ``run`` has started
        self.connections = 0  # connected onwards so far
        self._held: list[trio.CancelScope] = []

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (start it with ``nursery.start``)."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as handlers:
            task_status.started()
            await trio.serve_listeners(self._serve, listeners, handler_nursery=handlers)

    def drop_all(self) -> None:
        """Close every connection through it now, both ends."""
        for scope in self._held:
            scope.cancel()

    async def admit(self) -> bool:
        """Before a new connection is connected onwards: False closes it; waiting here holds it unanswered."""
        return True

    async def hold(self) -> None:
        """Between a read and its forwarding: waiting here holds what was read, and reads nothing more."""

    async def _serve(self, client: trio.SocketStream) -> None:
        async with client:
            if not await self.admit():
                return
            with trio.fail_after(CONNECT_LIMIT_S):
                upstream = await trio.open_tcp_stream(*self.upstream)
            self.connections += 1
            with trio.CancelScope() as held:
                self._held.append(held)
                async with upstream, trio.open_nursery() as pumps:
                    pumps.start_soon(self._pump, client, upstream, pumps.cancel_scope)
                    pumps.start_soon(self._pump, upstream, client, pumps.cancel_scope)

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream, pair: trio.CancelScope) -> None:
        try:
            while data := await source.receive_some(65536):
                await self.hold()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            pair.cancel()  # one side closed: so is the other


class LossyProxy(TcpProxy):
    """Loses a share of the exchanges through it, as a lossy network does, deciding per connection (a client that
    sends one request per connection loses whole requests or whole answers): ``lose_request`` of them never reach the
    server (the client's bytes are read and dropped), ``lose_answer`` of them reach it and are answered, and the
    answer is thrown away, and ``lose_head`` of them reach it cut short: a random part of the request's head is
    forwarded, the client is reset at once, and the server's side is closed once the server answers (its 400, 408 or
    timeout), as the lossy middlebox ADR 0019 met did. The client's connection is reset (RST), as a dropped link or a
    restarted middlebox does. Seeded: the same seed loses the same connections."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        seed: int = 0,
        lose_request: float = 0.0,
        lose_answer: float = 0.0,
        lose_head: float = 0.0,
        first: tuple[str, ...] = (),
    ) -> None:
        """``first``: the fates of the first connections, in order (``request``, ``answer`` or ``pass``), before
        the seeded draws decide."""
        super().__init__(host, port)
        self.first = list(first)
        self.random = random.Random(seed)
        self.lose_request = lose_request
        self.lose_answer = lose_answer
        self.lose_head = lose_head
        self.lost_requests = 0
        self.lost_answers = 0
        self.lost_heads = 0
        self.heads_held = 0  # cut requests whose server side is still open, waiting for the server's answer

    async def _serve(self, client: trio.SocketStream) -> None:
        draw = self.random.random()
        lost = "request" if draw < self.lose_request else "answer"
        fate = lost if draw < self.lose_request + self.lose_answer else "pass"
        if fate == "pass" and draw < self.lose_request + self.lose_answer + self.lose_head:
            fate = "head"
        if self.first:
            fate = self.first.pop(0)
        if fate == "head":
            await self._cut_in_the_head(client, self.random.random())
            return
        if fate not in ("request", "answer"):
            await super()._serve(client)
            return
        async with client:
            if fate == "request":
                with trio.move_on_after(CONNECT_LIMIT_S):
                    await client.receive_some(65536)
                self.lost_requests += 1
                _reset(client)
                return
            with trio.fail_after(CONNECT_LIMIT_S):
                upstream = await trio.open_tcp_stream(*self.upstream)
            async with upstream:
                await self._lose_the_answer(client, upstream)

    async def _lose_the_answer(self, client: trio.SocketStream, upstream: trio.SocketStream) -> None:
        """Forward the request; once the server has begun its answer (it has done the work), reset the client."""
        async with trio.open_nursery() as pumps:

            async def forward() -> None:
                try:
                    while data := await client.receive_some(65536):
                        await upstream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

            pumps.start_soon(forward)
            with trio.move_on_after(CONNECT_LIMIT_S):
                await upstream.receive_some(65536)
            self.lost_answers += 1
            _reset(client)
            pumps.cancel_scope.cancel()


    async def _cut_in_the_head(self, client: trio.SocketStream, share: float) -> None:
        """Forward ``share`` of the request's head (at least a byte), reset the client, then hold the server's side
        until the server answers or gives up, and close it."""
        async with client:
            with trio.fail_after(CONNECT_LIMIT_S):
                upstream = await trio.open_tcp_stream(*self.upstream)
            async with upstream:
                with trio.move_on_after(CONNECT_LIMIT_S):
                    data = await client.receive_some(65536)
                    head = data.split(b"\r\n\r\n")[0] + b"\r\n\r\n"
                    await upstream.send_all(head[: max(1, int(len(head) * share))])
                self.lost_heads += 1
                _reset(client)
                await client.aclose()
                self.heads_held += 1
                try:
                    with trio.move_on_after(CONNECT_LIMIT_S + 5):
                        await upstream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                finally:
                    self.heads_held -= 1


def _reset(stream: trio.SocketStream) -> None:
    """Close with a TCP reset rather than a FIN: the client reads ECONNRESET, not an empty answer."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class CutAfterRequests(TcpProxy):
    """Forwards until ``marker`` (the start of a request line, say ``b"POST /api/jobs/batch"``) has been seen ``count``
    times, then cuts: the connection that carries the next one is closed before it is forwarded, and every later
    connection is refused -- a server that went away after serving that many requests."""

    def __init__(self, host: str, port: int, *, marker: bytes, count: int) -> None:
        super().__init__(host, port)
        self.marker = marker
        self.count = count
        self.seen = 0

    async def admit(self) -> bool:
        return self.seen <= self.count

    async def _pump(self, source: trio.SocketStream, sink: trio.SocketStream, pair: trio.CancelScope) -> None:
        try:
            while data := await source.receive_some(65536):
                self.seen += data.count(self.marker)
                if self.seen > self.count:
                    _reset(source)
                    break
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            pair.cancel()
