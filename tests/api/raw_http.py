"""A client that speaks raw bytes to a live server (``Raw``), for the edge's tests: what a misbehaving client sends,
and what comes back, read as HTTP/1.1 by hand only to check it (the server's one parser is h11)."""

from __future__ import annotations

import json
from typing import Any

import trio
from api_support import Live

# Every exchange (an answer, or the end of a connection) must come within this.
EXCHANGE_S = 5.0


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def closes(self) -> bool:
        return "close" in self.headers.get("connection", "").lower()


class Raw:
    """One client connection, speaking raw bytes."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, data: bytes) -> bool:
        """Send; False if the server had already closed (a reset or broken pipe is an answer too)."""
        try:
            await self.stream.send_all(data)
        except trio.BrokenResourceError:
            return False
        return True

    async def _more(self) -> bool:
        try:
            chunk = await self.stream.receive_some()
        except trio.BrokenResourceError:  # reset by the server
            return False
        self.buffer += chunk
        return bool(chunk)

    async def answer(self) -> Answer:
        """The next whole answer (head and Content-Length body)."""
        with trio.fail_after(EXCHANGE_S):
            while b"\r\n\r\n" not in self.buffer:
                if not await self._more():
                    raise AssertionError(f"the server closed before a whole answer; got {self.buffer!r}")
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            status_line, *lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            while len(self.buffer) < length:
                if not await self._more():
                    raise AssertionError("the server closed in the middle of an answer")
            body, self.buffer = self.buffer[:length], self.buffer[length:]
            return Answer(int(status_line.split()[1]), headers, body)

    async def closed_by_server(self) -> bytes:
        """Wait until the server ends the connection; return whatever it sent before (nothing, if all is well)."""
        with trio.fail_after(EXCHANGE_S):
            while await self._more():
                pass
        data, self.buffer = self.buffer, b""
        return data


async def connect(live: Live) -> Raw:
    return Raw(await trio.open_tcp_stream("127.0.0.1", port_of(live)))


def port_of(live: Live) -> int:
    return int(live.url.rsplit(":", 1)[1])
