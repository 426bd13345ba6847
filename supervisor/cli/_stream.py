"""The CLI's reader of the event stream (``GET /api/events``), and the few reads that go with it, on trio.

``EventSource.run`` reads the stream and hands each message to a callback; when the connection drops (the server
restarts, a proxy cuts it, 90 s pass without even a keep-alive) it reconnects with ``Last-Event-ID`` and calls
``on_connected`` again, so that a command can re-read the rows it follows (a resume across a restart cannot replay
what the old boot announced: the stream says so with a ``stream.gap``). No polling: between events, the only
traffic is the server's keep-alive comments.

Errors are the client's: ``ApiError`` (the server refused: 401, 404, 422; not retried) and ``Unreachable`` (no
server for ``GIVE_UP_S``, or at the first attempt). A 503 (every stream slot taken, or the server unable to serve
now) is a busy server, never an unreachable one: the command says "busy", waits its ``Retry-After`` and asks again.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import trio

from ._client import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, ApiError, NotTheApi, Unreachable, _api_error, parse_answer

# Longer than the server's keep-alive interval (15 s by default, 60 s at most): silence this long is a dead link.
STREAM_READ_TIMEOUT_S = 90.0
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 5.0
# A server gone this long (refused, or not answering) ends the command with "unreachable".
GIVE_UP_S = 60.0
GAP = "stream.gap"


@dataclass
class Message:
    """One server-sent event."""

    id: str | None = None
    event: str = "message"
    data: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads("\n".join(self.data))


class Api:
    """The reads the streaming commands make, on an ``httpx.AsyncClient`` (every call with its timeout)."""

    def __init__(self, base_url: str, token: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=self.timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        try:
            response = await self.http.get(path, params=params, timeout=self.timeout)
        except httpx.TimeoutException as exc:
            why = type(exc).__name__
            raise Unreachable(f"the supervisor at {self.base_url} did not answer in time ({why})") from exc
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach the supervisor at {self.base_url}: {exc}") from exc
        if response.is_error:
            raise _api_error(response)
        return parse_answer(response.content, f"{self.base_url} (GET {path})")

    async def job(self, job_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self.get(f"/api/jobs/{quote(job_id, safe='')}")
        return answer

    async def running(self, limit: int = 100) -> list[dict[str, Any]]:
        answer = await self.get("/api/jobs", {"status": "running", "limit": limit})
        return list(answer["jobs"])

    async def queue(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self.get("/api/queue")
        return answer


OnMessage = Callable[[Message], Awaitable[bool]]  # True: stop reading
OnConnected = Callable[[], Awaitable[bool]]  # True: stop (e.g. every job is already terminal)


class EventSource:
    """``GET /api/events`` with the given filters, read until a callback says stop (or, without ``follow``, until
    the server ends the stream)."""

    def __init__(
        self,
        api: Api,
        *,
        jobs: Sequence[str] = (),
        kinds: Sequence[str] = (),
        backlog: bool = False,
        follow: bool = True,
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        params: list[tuple[str, str | int | float | bool | None]] = [("job", j) for j in jobs]
        params += [("kind", k) for k in kinds]
        params += [("backlog", "true" if backlog else "false"), ("follow", "true" if follow else "false")]
        self.params = params
        self.follow = follow
        self.last_event_id: str | None = None
        self.connected = False  # once: a later failure is a lost server (retried), not an unreachable one
        self.on_state = on_state or (lambda state: None)
        self.timeout = httpx.Timeout(STREAM_READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)

    async def run(self, on_message: OnMessage, on_connected: OnConnected | None = None) -> None:
        delay = RECONNECT_FIRST_S
        down_since: float | None = None
        while True:
            try:
                if await self._read_once(on_message, on_connected):
                    return
                if not self.follow:
                    return
                problem = "the server ended the stream"
            except NotTheApi:
                raise  # an answer, and not this API's: asking again will not change it
            except (httpx.TransportError, Unreachable) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            except ApiError as exc:
                if exc.status != 503:
                    raise
                # The server answered: it is busy (every stream slot taken) or cannot serve now, not gone. Wait what
                # it asks, re-read what the command follows (a `wait` learns its outcome meanwhile), and ask again.
                self.on_state(f"busy ({exc.describe()}); retrying")
                if on_connected is not None and await on_connected():
                    return
                await trio.sleep(min(max(exc.retry_after_s or delay, RECONNECT_FIRST_S), RECONNECT_MAX_S))
                delay = min(delay * 2, RECONNECT_MAX_S)
                down_since = None
                continue
            now = trio.current_time()
            if not self.connected:
                # Never connected at all: say so at once, as every other command does.
                raise Unreachable(f"cannot reach the supervisor at {self.api.base_url}: {problem}")
            down_since = now if down_since is None else down_since
            if now - down_since > GIVE_UP_S:
                raise Unreachable(f"lost the supervisor at {self.api.base_url} for {GIVE_UP_S:.0f} s: {problem}")
            self.on_state(f"reconnecting ({problem})")
            await trio.sleep(delay)  # a backoff between reconnects, not a poll
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def _read_once(self, on_message: OnMessage, on_connected: OnConnected | None) -> bool:
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        request = self.api.http.build_request(
            "GET", "/api/events", params=self.params, headers=headers, timeout=self.timeout
        )
        try:
            response = await self.api.http.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise Unreachable(f"no answer ({type(exc).__name__})") from exc
        try:
            if response.is_error:
                await response.aread()
                raise _api_error(response)
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                raise NotTheApi(f"{self.api.base_url} (GET /api/events) answered no event stream, so not this API")
            self.connected = True
            self.on_state("connected")
            if on_connected is not None and await on_connected():
                return True
            message = Message()
            seen = False
            async for line in response.aiter_lines():
                if line == "":
                    if seen:
                        if message.id is not None:
                            self.last_event_id = message.id
                        if await on_message(message):
                            return True
                    message, seen = Message(), False
                    continue
                if line.startswith(":"):
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "id":
                    message.id, seen = value, True
                elif name == "event":
                    message.event, seen = value, True
                elif name == "data":
                    message.data.append(value)
                    seen = True
            return False
        finally:
            await response.aclose()
