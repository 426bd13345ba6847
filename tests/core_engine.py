"""A fake Docker engine on a unix socket, for the engine's faults (ADR 0010).

The executor is pointed at it with ``DOCKER_HOST=unix://<its socket>``. Its mode is flipped by the test:

- ``proxy``: every byte goes to the real engine (``/var/run/docker.sock``) and back: the engine answers again;
- ``stopped``: it listens no more; its socket file stays, so a connect is refused (as a stopped dockerd's);
- ``hang``: it accepts and reads, and never answers;
- ``500``: every request is answered HTTP 500 with a JSON body;
- ``ping_only``: ``/_ping`` is answered OK, every other request 500 (a daemon whose containers cannot be reached);
- ``list_only``: ``/_ping`` OK and the container list answered (empty), every other request 500: an engine whose
  containers can be listed but not made (its containerd down), so the probe before a promotion passes and the start
  fails;
- ``list_then_hang``: as ``list_only``, but every other request is never answered;
- ``slow``: as ``ping_only``, each answer after ``SLOW_S`` (calls that overlap: the client's connection pool fills).
- ``withhold_start``: every request goes to the real engine and its answer back, one request at a time, but a
  container's start is never answered (sent on to the engine first when ``start_reaches_engine``: the container then
  runs) and a removal never answered nor sent: a start whose outcome the client cannot know (ADR 0014).

Flipping the mode closes every connection it holds (and waits until they are closed), so that a pooled connection
of the client's is never served by the mode before.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import trio

Mode = Literal[
    "proxy", "stopped", "hang", "500", "ping_only", "list_only", "list_then_hang", "slow", "withhold_start"
]
SLOW_S = 0.3
REAL_ENGINE = "/var/run/docker.sock"
_PING = re.compile(rb"^(GET|HEAD) (/v[0-9.]+)?/_ping[ ?]")
_LIST = re.compile(rb"^GET (/v[0-9.]+)?/containers/json[ ?]")
_START = re.compile(rb"^POST (/v[0-9.]+)?/containers/[^/ ]+/start[ ?]")
_REMOVE = re.compile(rb"^DELETE (/v[0-9.]+)?/containers/[^/ ]+[ ?]")
MAX_HEAD = 64 * 1024


class FakeEngine:
    def __init__(self, path: Path, *, real: str = REAL_ENGINE) -> None:
        self.path = path
        self.real = real
        self.mode: Mode = "proxy"
        self.start_reaches_engine = False  # withhold_start: the start is made on the real engine, only unanswered
        self.requests: list[bytes] = []  # the request line of every request it read (not those it proxied)
        self._connections: dict[trio.CancelScope, trio.Event] = {}  # each open connection: its scope, and its end
        self._serving: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled (start it with ``nursery.start``)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._listen()
            task_status.started()
            await trio.sleep_forever()

    async def set_mode(self, mode: Mode) -> None:
        """From now on, answer as ``mode``; returns once every connection of the mode before is closed."""
        was, self.mode = self.mode, mode
        open_now = list(self._connections.items())
        for scope, _ in open_now:
            scope.cancel()
        with trio.fail_after(5):
            for _, closed in open_now:
                await closed.wait()
        if mode == "stopped" and was != "stopped":
            assert self._serving is not None
            self._serving.cancel()
            self._serving = None
        elif mode != "stopped" and was == "stopped":
            await self._listen()

    async def _listen(self) -> None:
        assert self._nursery is not None
        self.path.unlink(missing_ok=True)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(str(self.path))
        sock.listen(1024)  # as many connects at once as a client makes (a real dockerd: SOMAXCONN)
        listener = trio.SocketListener(sock)
        scope = trio.CancelScope()
        self._serving = scope

        async def serve() -> None:
            # Closing the listener leaves the socket file: a connect to it is refused, as to a stopped engine's.
            async with listener:
                with scope:
                    async with trio.open_nursery() as handlers:
                        await trio.serve_listeners(self._handle, [listener], handler_nursery=handlers)

        self._nursery.start_soon(serve)

    async def _handle(self, stream: trio.SocketStream) -> None:
        closed = trio.Event()
        with trio.CancelScope() as scope:
            self._connections[scope] = closed
            try:
                async with stream:
                    handler: Callable[[trio.SocketStream], Awaitable[None]] = (
                        self._proxy if self.mode == "proxy" else self._answer
                    )
                    await handler(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # the client went away
            finally:
                del self._connections[scope]
                closed.set()

    async def _proxy(self, stream: trio.SocketStream) -> None:
        upstream = await trio.open_unix_socket(self.real)
        async with upstream:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                while data := await src.receive_some(65536):
                    await dst.send_all(data)
                nursery.cancel_scope.cancel()  # one side closed: the connection is over

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, stream, upstream)
                nursery.start_soon(pump, upstream, stream)

    async def _answer(self, stream: trio.SocketStream) -> None:
        """HTTP/1.1 with keep-alive: read each request (its head, and its body by Content-Length), answer it."""
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data or len(buffer) > MAX_HEAD:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            while len(buffer) < length:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            body, buffer = buffer[:length], buffer[length:]
            request_line = head.split(b"\r\n", 1)[0]
            self.requests.append(request_line)
            if self.mode == "withhold_start":
                await stream.send_all(await self._relay(head, body))
                continue
            if self.mode == "slow":
                await trio.sleep(SLOW_S)
            await stream.send_all(self._response(request_line))

    async def _relay(self, head: bytes, body: bytes) -> bytes:
        """One request to the real engine on a connection of its own (``Connection: close``), its whole answer back;
        a start or a removal as ``withhold_start`` says (answered never)."""
        request_line = head.split(b"\r\n", 1)[0]
        withheld = _START.match(request_line) or _REMOVE.match(request_line)
        if withheld and not (_START.match(request_line) and self.start_reaches_engine):
            await trio.sleep_forever()
        lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        upstream = await trio.open_unix_socket(self.real)
        async with upstream:
            await upstream.send_all(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body)
            answer = b""
            while data := await upstream.receive_some(65536):
                answer += data
        if withheld:
            await trio.sleep_forever()  # made on the engine; the client never hears of it
        return answer

    def _response(self, request_line: bytes) -> bytes:
        mode = self.mode
        if mode != "500" and _PING.match(request_line):  # (slow: the ping is what its tests ask)
            return _http(200, b"OK", b"text/plain; charset=utf-8")
        if mode in ("list_only", "list_then_hang") and _LIST.match(request_line):
            return _http(200, b"[]", b"application/json")
        if mode in ("hang", "list_then_hang"):
            return b""  # answered never: the caller's read times out (see _answer's next receive)
        body = json.dumps({"message": f"fake engine ({mode}): internal server error"}).encode()
        return _http(500, body, b"application/json")


def _http(status: int, body: bytes, content_type: bytes) -> bytes:
    reason = {200: b"OK", 500: b"Internal Server Error"}[status]
    head = [
        b"HTTP/1.1 %d %s" % (status, reason),
        b"Content-Type: " + content_type,
        b"Content-Length: %d" % len(body),
        b"Api-Version: 1.41",
        b"Server: fake-engine",
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body
