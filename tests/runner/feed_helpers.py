"""Helpers for the feed tests: the fixture feeds, their expectations, and a host map onto the local server.

The fixture feeds (``feeds/*.xml``) name real-looking hosts (``feeds.example.org``, ``media.example.org``,
``dts.podtrac.com``...). ``HostMap`` is an httpx transport that sends every request to the local test
server instead, keeping the original host as the first path segment: ``https://media.example.org/a.mp3``
is served by the route ``/media.example.org/a.mp3``. Everything else is the runner's real HTTP path:
its httpx client, real sockets, real redirects (a ``Location`` names the logical URL and is followed
by the client), and ``response.url`` stays the logical URL, as it would be on the internet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio
from runner_helpers import Handler, HttpServer, Request, respond

FEEDS_DIR = Path(__file__).resolve().parent / "feeds"
EXPECTED: dict[str, Any] = json.loads((FEEDS_DIR / "expected.json").read_text(encoding="utf-8"))
BASE: str = EXPECTED["base"]


def fixture(name: str) -> bytes:
    return (FEEDS_DIR / name).read_bytes()


def expected_episodes(name: str) -> list[dict[str, Any]]:
    episodes: list[dict[str, Any]] = EXPECTED["feeds"][name]["episodes"]
    return episodes


def route(url: str) -> str:
    """The local server's route for a logical URL (host kept as the first path segment)."""
    parsed = httpx.URL(url)
    return "/" + parsed.host + parsed.raw_path.decode("ascii")


class HostMap(httpx.AsyncBaseTransport):
    """Routes every request to 127.0.0.1:<port>, path ``/<original host><original path>``."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        local = httpx.URL(scheme="http", host="127.0.0.1", port=self._port, path="/").copy_with(
            raw_path=route(str(request.url)).encode("ascii")
        )
        forwarded = httpx.Request(request.method, local, headers=request.headers, stream=request.stream)
        # The client sets response.request back to `request`, so response.url is the logical URL.
        return await self._inner.handle_async_request(forwarded)

    async def aclose(self) -> None:
        await self._inner.aclose()


def redirect(location: str, status: int = 301) -> Handler:
    async def handler(request: Request, stream: trio.SocketStream) -> None:
        head = f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        await stream.send_all(head.encode())

    return handler


def audio_body(url: str) -> bytes:
    """What the server answers for an enclosure: names the URL, so a test can tell which file was fetched."""
    return f"audio of {url}".encode()


def serve_feed(server: HttpServer, url: str, document: bytes) -> None:
    server.routes[route(url)] = respond(200, document, content_type="application/rss+xml")


def serve_enclosures(server: HttpServer, urls: list[str]) -> None:
    for url in urls:
        server.routes[route(url)] = respond(200, audio_body(url), content_type="audio/mpeg")
