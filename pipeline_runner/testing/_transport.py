"""Scripted HTTP for in-process runs: an httpx transport whose servers answer, hang or drip in virtual time.

httpx enforces its ``Timeout`` in the network layer (httpcore), which a mock transport replaces; so this transport
enforces the request's own timeouts (``request.extensions["timeout"]``) as a real connection would: a server that
does not answer within the read timeout fails the request with ``httpx.ReadTimeout`` after exactly that many
(virtual) seconds, one that cannot be reached with ``httpx.ConnectTimeout`` after the connect timeout, and every
chunk of a body must come within the read timeout of the one before. A body that drips just inside it beats the
transport deadline: then only the episode budget stops it (docs/pipeline-runner.md § Deadlines (ADR-150 D6), tight
to loose).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import httpx
import trio

Reply = Callable[[httpx.Request], Awaitable[httpx.Response]]
"""What a scripted server does with one request: httpx.MockTransport's handler, asynchronous."""


def _timeout(request: httpx.Request, phase: str) -> float | None:
    value = request.extensions.get("timeout", {}).get(phase)
    return None if value is None else float(value)


async def _wait(request: httpx.Request, seconds: float, phase: str) -> None:
    """Wait ``seconds`` of the server's time, or fail as httpx does when the request's ``phase`` timeout is shorter."""
    limit = _timeout(request, phase)
    if limit is not None and seconds > limit:
        await trio.sleep(limit)
        error = httpx.ConnectTimeout if phase == "connect" else httpx.ReadTimeout
        raise error(f"scripted {phase} timeout after {limit:g} s", request=request)
    await trio.sleep(seconds)


class _TimedBody(httpx.AsyncByteStream):
    def __init__(self, request: httpx.Request, chunks: Sequence[bytes], every_s: float) -> None:
        self._request = request
        self._chunks = chunks
        self._every_s = every_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            await _wait(self._request, self._every_s, "read")
            yield chunk


def respond(
    status: int = 200,
    body: bytes = b"",
    *,
    json: Any = None,
    headers: Mapping[str, str] | None = None,
    after_s: float = 0.0,
) -> Reply:
    """A server that answers ``status`` with ``body`` (or ``json``) ``after_s`` virtual seconds after the request.

    An ``after_s`` past the request's read timeout is a ``httpx.ReadTimeout`` at the timeout."""

    async def reply(request: httpx.Request) -> httpx.Response:
        await request.aread()
        await _wait(request, after_s, "read")
        if json is not None:
            return httpx.Response(status, json=json, headers=headers)
        return httpx.Response(status, content=body, headers=headers)

    return reply


def hang() -> Reply:
    """A server that accepts the connection and never answers: the read timeout ends the request."""
    return respond(after_s=math.inf)


def unreachable() -> Reply:
    """A host that never completes the connection: the connect timeout ends the request."""

    async def reply(request: httpx.Request) -> httpx.Response:
        await _wait(request, math.inf, "connect")
        raise AssertionError("unreachable")  # pragma: no cover -- _wait raised

    return reply


def drip(body: bytes, *, every_s: float, chunk_bytes: int = 1, status: int = 200) -> Reply:
    """A server that sends the headers at once, then ``chunk_bytes`` of ``body`` every ``every_s`` virtual seconds.

    With ``every_s`` under the read timeout no read ever times out: the transport deadline cannot end it."""
    if every_s < 0 or chunk_bytes <= 0:
        raise ValueError("drip needs every_s >= 0 and chunk_bytes > 0")
    chunks = [body[i : i + chunk_bytes] for i in range(0, len(body), chunk_bytes)]

    async def reply(request: httpx.Request) -> httpx.Response:
        await request.aread()
        headers = {"Content-Length": str(len(body))}
        return httpx.Response(status, headers=headers, stream=_TimedBody(request, chunks, every_s))

    return reply


class ScriptedTransport(httpx.AsyncBaseTransport):
    """Answers each request by its URL (without the query) from ``routes``; any other URL gets a 404.

    A route is a :data:`Reply` (``respond``, ``hang``, ``unreachable``, ``drip``, or an ``async def`` taking the
    ``httpx.Request`` as httpx.MockTransport's handler does), or a list of them answering successive requests (the
    last one repeats)."""

    def __init__(self, routes: Mapping[str, Reply | Sequence[Reply]] | None = None) -> None:
        self._routes: dict[str, list[Reply]] = {}
        self._served: dict[str, int] = {}
        for url, reply in (routes or {}).items():
            self.route(url, reply)

    def route(self, url: str, reply: Reply | Sequence[Reply]) -> None:
        replies = [reply] if callable(reply) else list(reply)
        if not replies:
            raise ValueError(f"no reply for {url}")
        self._routes[str(httpx.URL(url).copy_with(query=None))] = replies

    def has_route(self, url: str) -> bool:
        return str(httpx.URL(url).copy_with(query=None)) in self._routes

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url.copy_with(query=None))
        replies = self._routes.get(url)
        if replies is None:
            await request.aread()
            return httpx.Response(404, content=b"no such route in the script")
        served = self._served.get(url, 0)
        self._served[url] = served + 1
        return await replies[min(served, len(replies) - 1)](request)


@dataclasses.dataclass(frozen=True, slots=True)
class FeedEpisode:
    """One item of a scripted feed."""

    guid: str
    enclosure_url: str
    duration_s: float | None = None
    title: str | None = None


def episode(guid: str, enclosure_url: str, *, duration_s: float | None = None, title: str | None = None) -> FeedEpisode:
    return FeedEpisode(guid, enclosure_url, duration_s, title)


def rss(*episodes: FeedEpisode, title: str = "Scripted feed") -> bytes:
    """An RSS 2.0 document listing ``episodes`` (audio enclosures; ``itunes:duration`` when given)."""
    items = []
    for ep in episodes:
        duration = "" if ep.duration_s is None else f"<itunes:duration>{ep.duration_s:g}</itunes:duration>"
        items.append(
            f"<item><title>{escape(ep.title or ep.guid)}</title><guid>{escape(ep.guid)}</guid>"
            f'<enclosure url={quoteattr(ep.enclosure_url)} type="audio/mpeg" length="0"/>{duration}</item>'
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        '<rss version="2.0" xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd">'
        f"<channel><title>{escape(title)}</title>{''.join(items)}</channel></rss>"
    ).encode()
