"""Reading plain requests ahead of h11 changes no answer: the same bytes, sent both ways, get the same answers.

``EdgeH11Protocol.answer_plain`` answers a plain heartbeat or enqueue without h11; a header value with a byte outside
ASCII (``THROUGH_H11``) makes it leave the same request to h11. Each case here is a heartbeat request changed at
random (a fixed seed): header case, whitespace, order, extra or repeated headers, a wrong ``Content-Length``, a stray
byte, the request line. Each is sent on its own connection twice, as it is and with that one header added, followed
by a health check that ends the exchange; the answers (status, body without the request id, whether the connection
closes) must be the same both ways. Where the two ways could disagree -- where a request ends, whether a head is
valid, what an early answer does to the connection -- this would show it.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import trio
from api_support import Live, MakeLive, wait_log_line
from test_api_heartbeat_direct import THROUGH_H11 as DIRECT_THROUGH_H11
from test_http_edge import HEALTH, Raw, connect, short_timeouts

from supervisor import _app, _server
from supervisor._http_edge import EdgeH11Protocol

__all__ = ["short_timeouts"]  # the fixture, used by name

CASES = 80
SEED = 20261201
# test_api_heartbeat_direct's header that sends a request through h11, as a head line.
THROUGH_H11 = ": ".join(DIRECT_THROUGH_H11).encode("latin-1") + b"\r\n"
STRAY_BYTES = [b"\x00", b"\x7f", b" ", b"\t", b":", b"\n", b"\r", b"\xe9", b"a", b"/", b"%"]


def mutated(rng: random.Random, job_id: str, token: str) -> tuple[bytes, bytes]:
    """A heartbeat request with one to three random changes: its head (without the blank line) and its body."""
    beat = json.dumps({"completed_units": rng.randint(0, 9)}).encode()
    line = f"POST /api/jobs/{job_id}/heartbeat HTTP/1.1".encode()
    headers = [
        [b"Host", b"supervisor"],
        [b"Authorization", f"Bearer {token}".encode()],
        [b"Content-Type", b"application/json"],
        [b"Content-Length", str(len(beat)).encode()],
    ]
    stray_at: tuple[int, bytes] | None = None
    for _ in range(rng.randint(1, 3)):
        change = rng.randrange(10)
        if change == 0:  # header names in another case
            for header in headers:
                header[0] = bytes(c ^ 0x20 if rng.random() < 0.5 and chr(c).isalpha() else c for c in header[0])
        elif change == 1:  # whitespace around a value
            header = rng.choice(headers)
            header[1] = rng.choice([b" ", b"\t", b"  "]) + header[1] + rng.choice([b"", b" ", b"\t"])
        elif change == 2:
            rng.shuffle(headers)
        elif change == 3:  # an extra header
            name = "X-" + "".join(rng.choice("abcdefgh-_.!#") for _ in range(rng.randint(1, 6)))
            headers.insert(
                rng.randrange(len(headers) + 1), [name.encode(), bytes(rng.choice(range(32, 127)) for _ in range(5))]
            )
        elif change == 4:  # a second Content-Type or Authorization
            headers.append(rng.choice([[b"Content-Type", b"text/plain"], [b"Authorization", b"Bearer wrong"]]))
        elif change == 5:  # a Content-Length that is off
            headers = [h for h in headers if h[0].lower() != b"content-length"]
            headers.append([b"Content-Length", str(max(0, len(beat) + rng.randint(-3, 3))).encode()])
        elif change == 6:  # a second Content-Length, same or not
            headers.append([b"Content-Length", rng.choice([str(len(beat)), "1"]).encode()])
        elif change == 7:
            stray_at = (rng.randrange(len(line) + 40), rng.choice(STRAY_BYTES))
        elif change == 8:  # the request line
            line = rng.choice([
                line.replace(b" /api", b"  /api"),
                line.replace(b"/heartbeat", b"/heartbeat/"),
                line + b" ",
                line.replace(b"HTTP/1.1", b"HTTP/1.0"),
                line.replace(b"POST", b"Post"),
            ])  # fmt: skip
        else:  # blank lines before the request
            line = b"\r\n" + line
    head = line + b"\r\n" + b"".join(name + b":" + value + b"\r\n" for name, value in headers)
    if stray_at is not None:
        at, byte = stray_at
        at = min(at, len(head) - 2)
        head = head[:at] + byte + head[at:]
    return head, beat


def normalized(answer: Any) -> tuple[int, Any, bool]:
    body: Any = answer.body
    if answer.headers.get("content-type") == "application/json":
        body = json.loads(body)
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            body["error"]["request_id"] = "<id>"
    return answer.status, body, answer.closes


async def exchange(live: Live, data: bytes) -> list[tuple[int, Any, bool]]:
    """Every answer to ``data`` + a health check, until the health check's or the connection's end."""
    client: Raw = await connect(live)
    answers: list[tuple[int, Any, bool]] = []
    async with client.stream:
        await client.send(data + HEALTH)
        while True:
            try:
                answer = await client.answer()
            except AssertionError:  # the server closed: nothing more comes
                break
            answers.append(normalized(answer))
            if answer.closes or (answer.status == 200 and b'"status":"ok"' in answer.body):
                break
    return answers


async def test_a_request_gets_the_same_answers_read_ahead_of_h11_or_through_it(
    short_timeouts: None, make_live: MakeLive, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Content-Length past the body's end waits for the rest, and a request left incomplete by a change waits for
    # the connection's idle timeout, both ways: not long.
    monkeypatch.setattr(_app, "BODY_TIMEOUT_S", 0.1)
    monkeypatch.setattr(_server, "KEEP_ALIVE_TIMEOUT_S", 0.1)
    live = await make_live()
    result = await live.supervisor.enqueue("tokened", {"seconds": 3600.0})
    job_id = result.job.job_id
    token = await wait_log_line(live.supervisor, job_id)
    ahead = 0
    original = EdgeH11Protocol._answer_plain

    async def counted(protocol: EdgeH11Protocol, *args: Any) -> bool:
        nonlocal ahead
        ahead += 1
        return await original(protocol, *args)

    monkeypatch.setattr(EdgeH11Protocol, "_answer_plain", counted)
    rng = random.Random(SEED)
    for case in range(CASES):
        head, beat = mutated(rng, job_id, token)
        with trio.fail_after(10):
            as_is = await exchange(live, head + b"\r\n" + beat)
            before = ahead
            through_h11 = await exchange(live, head + THROUGH_H11 + b"\r\n" + beat)
        assert ahead == before, f"case {case}: the request with a non-ASCII header was read ahead of h11"
        assert as_is == through_h11, f"case {case}: {head + b'|' + beat!r} {as_is} {through_h11}"
    # The cases exercise both ways: some are still plain after their changes, some are not.
    assert CASES // 5 < ahead < CASES
