"""Clients that misuse an HTTP connection to the supervisor (ADR 0019): each connection cuts its request's head or body
at a random byte, pipelines requests, reads part of an answer or nothing, and hangs up at a random moment or around
one of the edge's timeouts, with no token, a wrong one or a good one, on every kind of route. Used by the transport
fuzzer in ``make test`` (``tests/api/test_http_transport_fuzz.py``) and by ``make soak`` for its whole run.

Nothing here checks the server: the caller holds the invariants (the process up, health answered, a job beside them
never flagged, well-formed requests never a 5xx). What each connection did is counted in ``tally``.
"""

from __future__ import annotations

import json
import random
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass

import trio

WAYS = ("cut_head", "cut_body", "no_body", "hang_up_before_answer", "read_part", "pipeline", "idle")


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    body: bytes | None = None


@dataclass(frozen=True)
class Timeouts:
    """The edge's timeouts the connections hang up around (``HttpLimits``)."""

    keep_alive_s: float
    body_s: float
    response_s: float


def routes(job_id: str, enqueue: dict[str, object]) -> list[Route]:
    """Every kind of route: reads, a stream, the log, enqueues, a heartbeat, a cancel, the queue's and the operator's
    posts. ``job_id``: a job that exists; ``enqueue``: a valid job request (kind and params)."""
    one = json.dumps(enqueue).encode()
    batch = json.dumps({"jobs": [enqueue] * 3}).encode()
    return [
        Route("GET", "/api/health"),
        Route("GET", "/api/jobs?limit=50"),
        Route("GET", f"/api/jobs/{job_id}"),
        Route("GET", "/api/queue"),
        Route("GET", "/metrics"),
        Route("GET", "/api/events?follow=false"),
        Route("GET", "/api/events"),
        Route("GET", f"/api/jobs/{job_id}/log?tail_bytes=100"),
        Route("POST", "/api/jobs", one),
        Route("POST", "/api/jobs/batch", batch),
        Route("POST", f"/api/jobs/{job_id}/heartbeat", b'{"completed_units": 1}'),
        Route("POST", "/api/jobs/no-such-job/cancel", b""),
        Route("POST", "/api/queue/resume", b""),
        Route("POST", "/api/jobs/reconcile", b""),
    ]


def request(route: Route, token: str | None, *, declared_body: int | None = None) -> bytes:
    """The request's bytes; ``declared_body``: a ``Content-Length`` other than the body's (a body never sent whole)."""
    head = f"{route.method} {route.path} HTTP/1.1\r\nHost: misbehave\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    body = route.body or b""
    if route.method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {declared_body or len(body)}\r\n"
    return (head + "\r\n").encode() + body


async def misbehave(
    rng: random.Random,
    port: int,
    all_routes: Sequence[Route],
    tokens: Sequence[str | None],
    timeouts: Timeouts,
    tally: MutableMapping[str, int],
    *,
    host: str = "127.0.0.1",
) -> None:
    """One misbehaving connection; what it sends and when it hangs up are ``rng``'s. Bounded: at most about 5 s
    plus the longest of ``timeouts``."""
    route = rng.choice(all_routes)
    token = rng.choice(tokens)
    whole = request(route, token)
    pipelined = b"".join(request(rng.choice(all_routes), token) for _ in range(rng.randint(2, 5)))
    how = rng.choice(WAYS)
    tally[how] = tally.get(how, 0) + 1
    around = rng.choice([timeouts.keep_alive_s, timeouts.body_s, timeouts.response_s, 0.0]) + rng.uniform(-0.05, 0.05)
    try:
        stream = await trio.open_tcp_stream(host, port)
    except OSError:
        tally["connect_refused"] = tally.get("connect_refused", 0) + 1
        return
    async with stream:
        try:
            with trio.move_on_after(5):
                if how == "cut_head":
                    head = whole.split(b"\r\n\r\n")[0]
                    await stream.send_all(head[: rng.randint(1, max(1, len(head) - 1))])
                elif how in ("cut_body", "no_body") and route.method == "POST":
                    declared = len(route.body or b"") + rng.randint(1, 200)
                    data = request(route, token, declared_body=declared)
                    await stream.send_all(data if how == "cut_body" else data[: data.index(b"\r\n\r\n") + 4])
                elif how == "pipeline":
                    await stream.send_all(pipelined)
                    await stream.receive_some(rng.randint(1, 4096))
                elif how == "idle":
                    await stream.send_all(whole)
                    await stream.receive_some()  # one answer's start, then silence past the keep-alive
                else:
                    await stream.send_all(whole)
                    if how == "read_part":
                        await stream.receive_some(rng.randint(1, 64))
            await trio.sleep(max(0.0, around))  # the hang-up's moment is the scenario, not a wait for an event
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the server closed first: an answer too


async def keep_misbehaving(
    rng: random.Random,
    port: int,
    all_routes: Sequence[Route],
    tokens: Sequence[str | None],
    timeouts: Timeouts,
    tally: MutableMapping[str, int],
    *,
    at_once: int,
    count: int | None = None,
) -> None:
    """``count`` misbehaving connections (None: until cancelled), ``at_once`` at a time."""
    limiter = trio.CapacityLimiter(at_once)

    async def one(r: random.Random, borrower: object) -> None:
        try:
            await misbehave(r, port, all_routes, tokens, timeouts, tally)
        finally:
            limiter.release_on_behalf_of(borrower)

    async with trio.open_nursery() as nursery:
        started = 0
        while count is None or started < count:
            borrower = object()  # the connection's own place, released by its task
            await limiter.acquire_on_behalf_of(borrower)
            nursery.start_soon(one, random.Random(rng.random()), borrower)
            started += 1
