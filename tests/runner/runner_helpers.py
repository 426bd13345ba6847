"""Helpers for the pipeline-runner tests: a misbehaving HTTP server, fake networks, subprocess helpers.

A separate module (not conftest) so that `from runner_helpers import ...` can never resolve to
another directory's conftest. The fixtures live in this directory's conftest.py.

The server is a tiny Trio HTTP/1.1 server (h11 parses requests; responses are written raw so a
handler can lie about Content-Length, hang after the headers, or drip one byte at a time). Every
request is recorded, and tests wait for requests as events -- never by sleeping.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h11
import httpx
import trio

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    # The package may not be installed into the venv yet (`make` installs it editable).
    sys.path.insert(0, str(REPO_ROOT))


# -- the misbehaving server -----------------------------------------------------------------------


@dataclasses.dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Request, trio.SocketStream], Awaitable[None]]


class HttpServer:
    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self.requests: list[Request] = []
        self.port = 0
        self._changed = trio.Event()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def requests_to(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    async def wait_for_requests(self, path: str, count: int = 1) -> list[Request]:
        while len(self.requests_to(path)) < count:
            await self._changed.wait()
        return self.requests_to(path)

    async def _record(self, request: Request) -> None:
        self.requests.append(request)
        self._changed.set()
        self._changed = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            request = await _read_request(stream)
            if request is None:
                return
            await self._record(request)
            handler = self.routes.get(request.path, respond(404, b"not found"))
            await handler(request, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()


async def _read_request(stream: trio.SocketStream) -> Request | None:
    conn = h11.Connection(h11.SERVER)
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(65536)
            if not data:
                return None
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return Request(
                method=head.method.decode(),
                path=head.target.decode(),
                headers={k.decode().lower(): v.decode() for k, v in head.headers},
                body=bytes(body),
            )
        else:
            return None


def _head(status: int, headers: Mapping[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers.items()] + ["Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def respond(
    status: int, body: bytes = b"", *, content_type: str = "application/octet-stream", content_length: int | None = None
) -> Handler:
    """A plain answer; ``content_length`` lies about the size when given."""

    async def handler(request: Request, stream: trio.SocketStream) -> None:
        length = len(body) if content_length is None else content_length
        await stream.send_all(_head(status, {"Content-Type": content_type, "Content-Length": str(length)}) + body)

    return handler


def hang_after_headers(content_length: int = 1000) -> Handler:
    async def handler(request: Request, stream: trio.SocketStream) -> None:
        await stream.send_all(_head(200, {"Content-Length": str(content_length)}))
        await trio.sleep_forever()

    return handler


def drip(total_bytes: int = 1000, interval_s: float = 1.0, *, after: bytes = b"") -> Handler:
    """Send ``after`` at once, then one byte every ``interval_s``: each byte resets the read timeout."""

    async def handler(request: Request, stream: trio.SocketStream) -> None:
        await stream.send_all(_head(200, {"Content-Length": str(total_bytes)}) + after)
        for _ in range(total_bytes - len(after)):
            await trio.sleep(interval_s)  # the misbehaviour itself, not a wait for an event
            await stream.send_all(b"x")

    return handler


def json_answer(payload: Any, status: int = 200) -> Handler:
    return respond(status, json.dumps(payload).encode(), content_type="application/json")


def no_content() -> Handler:
    async def handler(request: Request, stream: trio.SocketStream) -> None:
        await stream.send_all(_head(204, {}))

    return handler


# -- feeds ----------------------------------------------------------------------------------------


def rss(items: Sequence[tuple[str, str, str | None]], title: str = "Test feed") -> bytes:
    """items: (guid, enclosure_url, itunes duration or None)."""
    parts = []
    for guid, url, duration in items:
        dur = f"<itunes:duration>{duration}</itunes:duration>" if duration else ""
        parts.append(
            f"<item><title>Episode {guid}</title><guid>{guid}</guid>"
            f'<enclosure url="{url}" type="audio/mpeg" length="0"/>{dur}</item>'
        )
    return (
        '<?xml version="1.0"?><rss version="2.0" xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd">'
        f"<channel><title>{title}</title>{''.join(parts)}</channel></rss>"
    ).encode()


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
]>
<rss version="2.0"><channel><title>&lol4;</title></channel></rss>"""

MALFORMED_XML = b'<?xml version="1.0"?><rss version="2.0"><channel><title>oops</channel>'


# -- in-process runs on a fake network (MockClock-friendly) -----------------------------------------

FakeHandler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class FakeNet:
    """An httpx MockTransport routed by URL path; for virtual-time tests that must not touch sockets."""

    def __init__(self) -> None:
        self.routes: dict[str, FakeHandler] = {}
        self.calls: list[tuple[str, str]] = []

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        handler = self.routes.get(request.url.path)
        if handler is None:
            return httpx.Response(404)
        return await handler(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self._handle)

    def calls_to(self, path: str) -> int:
        return sum(1 for _, p in self.calls if p == path)


def fake_ok(body: bytes = b"audio" * 10) -> FakeHandler:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.lowlevel.checkpoint()
        return httpx.Response(200, content=body)

    return handler


def fake_json(payload: Any) -> FakeHandler:
    async def handler(request: httpx.Request) -> httpx.Response:
        await request.aread()
        return httpx.Response(200, json=payload)

    return handler


def fake_status(status: int) -> FakeHandler:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.lowlevel.checkpoint()
        return httpx.Response(status)

    return handler


def fake_hang() -> FakeHandler:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    return handler


# -- the real runner as a subprocess ---------------------------------------------------------------


def runner_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PODCAST_JOB_DATA_DIR"] = str(data_dir)
    env["PODCAST_JOB_ID"] = "job-1"
    env.update(extra)
    return env


@dataclasses.dataclass
class Finished:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]


def parse_events(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.decode().splitlines() if line.strip()]


async def run_runner(args: Sequence[str], env: Mapping[str, str], *, cwd: Path, limit_s: float = 20) -> Finished:
    with trio.fail_after(limit_s):
        proc = await trio.run_process(
            [sys.executable, "-m", "pipeline_runner", *args],
            env=env,
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return Finished(proc.returncode, parse_events(proc.stdout), proc.stderr.decode())


class LiveRunner:
    """A runner subprocess whose events are read as they come, so a test can act mid-run."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.events: list[dict[str, Any]] = []
        self._buffer = b""

    async def next_event(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                raise EOFError("runner closed stdout")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        return event

    async def wait_for_event(self, name: str, count: int = 1) -> None:
        while sum(1 for e in self.events if e["event"] == name) < count:
            await self.next_event()

    async def drain(self) -> None:
        try:
            while True:
                await self.next_event()
        except EOFError:
            pass


async def spawn_runner(nursery: trio.Nursery, args: Sequence[str], env: Mapping[str, str], *, cwd: Path) -> LiveRunner:
    process: trio.Process = await nursery.start(
        functools.partial(
            trio.run_process,
            [sys.executable, "-m", "pipeline_runner", *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            check=False,
        )
    )
    return LiveRunner(process)
