"""``TcpProxy``: a TCP proxy on 127.0.0.1 in front of a server, for the tests of what a client sees when the path to
its server fails (a module of ``tests/``, importable from every test directory). Each kind of failure is a subclass
that says when a new connection is let through (``admit``) and what happens between a read and its forwarding
(``hold``)."""

from __future__ import annotations

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
