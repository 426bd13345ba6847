"""``GET /api/events`` on a live server (``run_supervisor`` on port 0), read by real clients: httpx streaming, and a
raw socket that stops reading.

Events are made by enqueueing into a paused queue (one ``job.transition`` per job, nothing runs) or by running
quick jobs. Every wait is bounded by ``trio.fail_after``; nothing sleeps to wait.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio
from api_support import API_TOKEN, WAIT_S, Live, MakeLive, poll_until, wait_terminal

from supervisor.api import HttpLimits

TIMEOUT = httpx.Timeout(10.0)
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
# A dropped reader's connection is closed within this (at once; the bound is for a loaded machine).
CUT_S = 2.5


@dataclass
class Message:
    id: str | None = None
    event: str | None = None
    data: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads("\n".join(self.data))


class Reader:
    """A server-sent-events reader over an httpx streaming response: messages, and the comments seen."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.comments: list[str] = []
        self._lines = response.aiter_lines()

    async def aclose(self) -> None:
        await self._lines.aclose()  # type: ignore[attr-defined]

    async def next(self) -> Message | None:
        """The next message; None at the end of the stream."""
        message = Message()
        seen = False
        async for line in self._lines:
            if line == "":
                if seen:
                    return message
                continue
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
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
        return None

    async def take(self, n: int) -> list[Message]:
        out = []
        with trio.fail_after(WAIT_S):
            while len(out) < n:
                message = await self.next()
                assert message is not None, f"the stream ended after {out}"
                out.append(message)
        return out


@asynccontextmanager
async def stream(live: Live, query: str = "", headers: dict[str, str] | None = None) -> AsyncIterator[Reader]:
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        with trio.fail_after(WAIT_S):
            request = client.build_request("GET", f"/api/events{query}", headers={**AUTH, **(headers or {})})
            response = await client.send(request, stream=True)
        try:
            assert response.status_code == 200, await response.aread()
            assert response.headers["content-type"].startswith("text/event-stream")
            reader = Reader(response)
            try:
                yield reader
            finally:
                await reader.aclose()
        finally:
            await response.aclose()


async def enqueue_paused(client: httpx.AsyncClient, n: int, text: str = "x") -> list[str]:
    """``n`` jobs into the paused queue: one job.transition (enqueued) each, none runs."""
    jobs = [{"kind": "echo", "params": {"text": text}} for _ in range(n)]
    response = await client.post("/api/jobs/batch", json={"jobs": jobs}, headers=AUTH, timeout=TIMEOUT)
    assert response.status_code == 202, response.text
    return [job["job_id"] for job in response.json()["jobs"]]


@pytest.fixture
async def live(make_live: MakeLive) -> AsyncIterator[Live]:
    live = await make_live(api_token=API_TOKEN, events_keepalive_s=0.2)
    await live.supervisor.pause()
    yield live


async def test_events_carry_the_webhook_payload_with_the_stream_id(live: Live) -> None:
    async with stream(live) as reader, httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        [job_id] = await enqueue_paused(client, 1)
        [message] = await reader.take(1)
        body = message.json()
        assert message.event == "job.transition"
        assert message.id == body["event_id"] == f"{live.supervisor.boot_id}-1"
        assert set(body) == {"event_id", "event", "job", "previous_status", "reason", "boot_id", "ts"}
        assert (body["event"], body["previous_status"], body["reason"]) == ("job.transition", None, "enqueued")
        assert body["job"]["job_id"] == job_id and body["job"]["status"] == "queued"
        assert body["boot_id"] == live.supervisor.boot_id
        # An idle stream says it is alive (keep-alive comments, here every 0.2 s).
        with trio.fail_after(WAIT_S):
            while "keep-alive" not in reader.comments:
                await _one_line(reader)


async def _one_line(reader: Reader) -> None:
    """Read one line (a keep-alive comment arrives as one)."""
    line = await reader._lines.__anext__()
    if line.startswith(":"):
        reader.comments.append(line[1:].strip())


async def test_a_job_s_whole_life_is_on_the_stream_filtered_by_job_and_kind(live: Live) -> None:
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        [other] = await enqueue_paused(client, 1, "other")
        [job_id] = await enqueue_paused(client, 1, "mine")
        async with (
            stream(live, f"?job={job_id}&job=nosuchjob") as mine,
            stream(live, "?kind=job.stalled") as stalled_only,
        ):
            await client.post("/api/queue/resume", headers=AUTH, timeout=TIMEOUT)
            await wait_terminal(live.supervisor, job_id)
            await wait_terminal(live.supervisor, other)
            messages = await mine.take(2)
            assert [m.json()["job"]["job_id"] for m in messages] == [job_id, job_id]
            assert [(m.json()["previous_status"], m.json()["job"]["status"]) for m in messages] == [
                ("queued", "running"),
                ("running", "succeeded"),
            ]
            # Nothing stalled: that stream carried no message, only keep-alives.
            with trio.fail_after(WAIT_S):
                while "keep-alive" not in stalled_only.comments:
                    await _one_line(stalled_only)
            assert stalled_only.comments.count("stream open") == 1


async def test_a_reader_that_resumes_with_last_event_id_loses_and_repeats_nothing(live: Live) -> None:
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        async with stream(live) as reader:
            first = await enqueue_paused(client, 5)
            seen = await reader.take(3)
        # Disconnected after 3 of 5; more happen meanwhile.
        later = await enqueue_paused(client, 4)
        async with stream(live, headers={"Last-Event-ID": seen[-1].id or ""}) as resumed:
            rest = await resumed.take(6)
            more = await enqueue_paused(client, 1)
            [live_one] = await resumed.take(1)
    got = [m.json()["job"]["job_id"] for m in [*seen, *rest, live_one]]
    assert got == [*first, *later, *more]
    ids = [m.id for m in [*seen, *rest, live_one]]
    assert ids == [f"{live.supervisor.boot_id}-{n}" for n in range(1, 11)]
    assert not any(m.event == "stream.gap" for m in rest)


async def test_a_resume_past_the_ring_or_from_another_boot_is_told_of_the_gap(make_live: MakeLive) -> None:
    live = await make_live(api_token=API_TOKEN, events_replay_events=3)
    await live.supervisor.pause()
    boot = live.supervisor.boot_id
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        jobs = await enqueue_paused(client, 6)
        async with stream(live, headers={"Last-Event-ID": f"{boot}-1"}) as reader:
            gap, *replayed = await reader.take(4)
        assert gap.event == "stream.gap" and gap.id is None
        assert gap.json() == {
            "reason": "evicted",
            "last_event_id": f"{boot}-1",
            "boot_id": boot,
            "oldest_event_id": f"{boot}-4",
        }
        assert [m.json()["job"]["job_id"] for m in replayed] == jobs[3:]
        async with stream(live, headers={"Last-Event-ID": "0123abcd-77"}) as reader:
            gap, *replayed = await reader.take(4)
        assert gap.json()["reason"] == "restarted"
        assert [m.id for m in replayed] == [f"{boot}-{n}" for n in (4, 5, 6)]
        # Without follow: what is held, then the end.
        async with stream(live, "?backlog=true&follow=false") as reader:
            held = await reader.take(3)
            with trio.fail_after(WAIT_S):
                assert await reader.next() is None
        assert [m.json()["job"]["job_id"] for m in held] == jobs[3:]


@pytest.mark.parametrize(
    ("query", "headers", "field_name"),
    [
        ("?kind=job.finished", {}, "kind"),
        ("?follow=yes", {}, "follow"),
        ("?backlog=true&backlog=false", {}, "backlog"),
        ("?jobs=abc", {}, "jobs"),
        ("", {"Last-Event-ID": "not-an-id"}, "Last-Event-ID"),
        ("", {"Last-Event-ID": "abc-999999"}, None),  # another boot's: a gap, not an error (checked below)
    ],
)
async def test_bad_input_is_a_4xx_naming_the_field(
    live: Live, query: str, headers: dict[str, str], field_name: str | None
) -> None:
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        request = client.build_request("GET", f"/api/events{query}", headers={**AUTH, **headers})
        with trio.fail_after(WAIT_S):
            response = await client.send(request, stream=True)
        try:
            if field_name is None:
                assert response.status_code == 200
                return
            body = json.loads(await response.aread())
        finally:
            await response.aclose()
    assert response.status_code == 422, body
    assert body["error"]["field"] == field_name, body


async def test_a_later_id_of_this_boot_is_refused(live: Live) -> None:
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        headers = {**AUTH, "Last-Event-ID": f"{live.supervisor.boot_id}-5"}
        response = await client.get("/api/events", headers=headers, timeout=TIMEOUT)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "Last-Event-ID"


async def test_the_stream_needs_the_api_token_and_is_bounded_in_readers(make_live: MakeLive) -> None:
    live = await make_live(api_token=API_TOKEN, events_max_clients=1, events_keepalive_s=0.2)
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        refused = await client.get("/api/events", timeout=TIMEOUT)
        assert refused.status_code == 401
        async with stream(live):
            full = await client.get("/api/events", headers=AUTH, timeout=TIMEOUT)
            assert full.status_code == 503
            assert full.json()["error"]["code"] == "too_many_streams"
        # The reader's slot is free again once it has gone.
        await poll_until(lambda: _true_when(live.supervisor.event_log.clients == 0))


async def _true_when(condition: bool) -> bool | None:
    return True if condition else None


async def test_a_reader_that_stops_reading_is_dropped_and_holds_no_memory(make_live: MakeLive) -> None:
    """Two readers under the same load: one reads everything and is never dropped; the other stops reading, so the
    server's writes to it block (the sockets' buffers full), its queue fills, and it is dropped: its queue freed,
    its connection closed at once. Each burst (a batch of BATCH enqueues) is smaller than a queue: only a reader
    that does not read can fill one."""
    buffer, batch = 64, 16
    live = await make_live(api_token=API_TOKEN, events_client_buffer_events=buffer, events_keepalive_s=60.0)
    await live.supervisor.pause()
    log = live.supervisor.event_log
    host, port = live.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    # A small receive window, so that the server's writes block sooner.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(WAIT_S)
    sent = 0
    try:
        async with stream(live) as reader, trio.open_nursery() as nursery:
            read: list[str] = []

            async def read_all() -> None:
                while (message := await reader.next()) is not None:
                    read.append(message.json()["job"]["job_id"])

            nursery.start_soon(read_all)
            await trio.to_thread.run_sync(sock.connect, (host, int(port)))
            request = f"GET /api/events HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_TOKEN}\r\n\r\n"
            sock.sendall(request.encode())
            head = await trio.to_thread.run_sync(sock.recv, 4096)
            assert head.startswith(b"HTTP/1.1 200"), head
            await poll_until(lambda: _true_when(log.clients == 2))
            # Now the raw socket reads nothing more. Events pile up: in the sockets' buffers, then in its queue,
            # then it is dropped. No queue ever holds more than its bound meanwhile.
            async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
                with trio.fail_after(WAIT_S * 6):
                    while not log.dropped:
                        sent += len(await enqueue_paused(client, batch))
                        assert log.buffered() <= 2 * buffer
            assert log.dropped == 1
            assert log.clients == 1 and log.buffered() <= buffer  # the reader that reads is still there
            # The server closed its end at once, though the client still reads nothing: its blocked write was cut,
            # not left waiting for a reader that never comes. (Without the cut it stays open: CUT_S is short.)
            client_port = sock.getsockname()[1]
            await poll_until(
                lambda: _true_when(server_side_state(int(port), client_port) != "ESTABLISHED"), limit_s=CUT_S
            )
            # The reader that reads got every event, and goes on getting them.
            async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
                last = await enqueue_paused(client, 1)
            await poll_until(lambda: _true_when(len(read) == sent + 1))
            assert read[-1] == last[0]
            nursery.cancel_scope.cancel()

        # The dropped one, reading on, reaches the end: what was in flight, then EOF.
        def drain() -> int:
            total = 0
            while chunk := sock.recv(65536):
                total += len(chunk)
            return total

        with trio.fail_after(WAIT_S):
            await trio.to_thread.run_sync(drain)
    finally:
        sock.close()


async def test_a_reader_keeps_up_with_the_largest_burst_at_the_default_bound(make_live: MakeLive) -> None:
    """A batch enqueue announces 1,000 events in one go, before any reader runs: the default queue takes them."""
    live = await make_live(api_token=API_TOKEN)
    await live.supervisor.pause()
    async with stream(live) as reader, httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        jobs = await enqueue_paused(client, 1000)
        got = await reader.take(1000)
    assert [m.json()["job"]["job_id"] for m in got] == jobs
    assert live.supervisor.event_log.dropped == 0


def server_side_state(server_port: int, client_port: int) -> str | None:
    """The TCP state of the server's end of the connection from ``client_port`` (None: gone)."""
    names = {"01": "ESTABLISHED", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE"}
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if int(local.rsplit(":", 1)[1], 16) == server_port and int(remote.rsplit(":", 1)[1], 16) == client_port:
                return names.get(state, state)
    return None


async def test_shutdown_ends_open_streams_at_once(make_live: MakeLive) -> None:
    limits = HttpLimits(graceful_timeout_s=5.0)
    live = await make_live(api_token=API_TOKEN, limits=limits, events_keepalive_s=60.0)
    async with stream(live) as reader:
        started = trio.current_time()
        live.shutdown.set()
        with trio.fail_after(WAIT_S):
            assert await reader.next() is None  # the stream ends (not cut): its last chunk arrived
            await live.stopped.wait()
        # Well within the graceful deadline: the stream did not hold the stop.
        assert trio.current_time() - started < limits.graceful_timeout_s


async def test_a_full_stream_answers_503_too_many_streams_with_retry_after(make_live: MakeLive) -> None:
    """The 503 had no Retry-After, and the CLI took it for a server that was not there."""
    live = await make_live(api_token=API_TOKEN, events_max_clients=1)
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with (
        httpx.AsyncClient(base_url=live.url, headers=headers, timeout=WAIT_S) as client,
        client.stream("GET", "/api/events", timeout=WAIT_S) as first,
    ):
        assert first.status_code == 200
        second = await client.get("/api/events", timeout=WAIT_S)
        assert second.status_code == 503 and second.headers["retry-after"] == "2"
        assert second.json()["error"]["code"] == "too_many_streams"


async def test_a_reader_that_reads_nothing_loses_its_slot_within_a_bound(make_live: MakeLive) -> None:
    """A reader suspended with Ctrl-Z held its slot for as long as the server was quiet. Its kernel takes the bytes
    for it until its receive buffer is full; the padded keep-alives fill it, the write then stalls, and the edge cuts
    it: the slot is free for the next reader."""
    live = await make_live(
        api_token=API_TOKEN, events_max_clients=1, events_keepalive_s=1.0, limits=HttpLimits(write_stall_timeout_s=1.0)
    )
    host, port = live.url.removeprefix("http://").split(":")
    stopped = await trio.open_tcp_stream(host, int(port))  # a real socket, with the kernel's usual buffers
    async with stopped:
        await stopped.send_all(
            f"GET /api/events HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {API_TOKEN}\r\n\r\n".encode()
        )
        with trio.fail_after(WAIT_S):
            opened = b""
            while b"stream open" not in opened:  # it has its slot; from here on it reads nothing
                opened += await stopped.receive_some(1024)
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        async with httpx.AsyncClient(base_url=live.url, headers=headers, timeout=WAIT_S) as client:

            async def slot_free() -> bool | None:
                async with client.stream("GET", "/api/events", timeout=WAIT_S) as answer:
                    return True if answer.status_code == 200 else None  # closed at once: a probe, not a reader

            assert await slot_free() is None  # the stopped reader holds the only slot
            # Freed after about 13 s here (12 keep-alives filled the two kernels' buffers, then a 1 s stall); the old
            # 13-byte keep-alives never filled them.
            await poll_until(slot_free, limit_s=90)
