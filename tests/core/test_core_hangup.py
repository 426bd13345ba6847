"""ADR 0014 end to end through a real ``supervisor serve``: a client that hangs up on a request that moves the queue
(``POST /api/queue/resume``, the operator's ``POST /api/jobs/reconcile``) a few milliseconds after sending it -- a
Ctrl-C of the CLI, a script's timeout, a flaky link -- never strands a job or a slot. Before the fix, the drain ran in
the request's own task: the reset cancelled it between the promotion and the starts, and the promoted rows held every
slot, running with no process, until a restart."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trio
from core_helpers import poll, serve_env  # type: ignore[import-not-found]

from supervisor import SqliteRegistry

SLOTS = 4
# How long after sending the request the client resets its connection (0: at once). The window that wedged the queue
# was about 5-20 ms after the request on a quiet machine; a spread around it meets every step of the request's work.
DELAYS_S = (0.0, 0.002, 0.005, 0.01, 0.02, 0.05)
ROUNDS = 3


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # No sweep during the test: the request under test (and the client's retry of it) is what moves the queue.
    return serve_env(tmp_path, PODCAST_JOB_MAX_CONCURRENT=str(SLOTS), PODCAST_JOB_SWEEP_SECONDS="3600")


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SqliteRegistry]:
    """The server's registry, as another process on the box sees it."""
    reg = SqliteRegistry(tmp_path / "data" / ".viewer" / "jobs.sqlite3")
    yield reg
    await reg.aclose()


async def _hang_up(url: str, path: str, delay_s: float) -> None:
    """Send ``POST path`` and reset the connection ``delay_s`` later, without reading the answer."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    try:
        await sock.connect((parts.hostname, parts.port))
        await sock.send(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        await trio.sleep(delay_s)  # the client's own timing: the failure injected, not a wait for an event
        # SO_LINGER 0: close() sends a reset, as a killed client's kernel does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


async def _all_done(client: httpx.AsyncClient, url: str, ids: list[str]) -> list[dict[str, object]] | None:
    rows = [(await client.get(f"{url}/api/jobs/{job_id}")).json() for job_id in ids]
    return rows if all(row["status"] not in ("queued", "running") for row in rows) else None


@pytest.mark.parametrize("path", ["/api/queue/resume", "/api/jobs/reconcile"])
async def test_a_client_that_hangs_up_on_a_request_that_moves_the_queue_never_strands_a_job_or_a_slot(
    start_server: Callable[[], trio.Process], registry: SqliteRegistry, path: str
) -> None:
    server = await start_server()  # type: ignore[misc]
    url = server.url
    async with httpx.AsyncClient(timeout=10) as client:
        for delay_s in DELAYS_S:
            for _ in range(ROUNDS):
                assert (await client.post(f"{url}/api/queue/pause")).status_code == 200
                ids = []
                for _ in range(SLOTS):
                    answer = await client.post(f"{url}/api/jobs", json={"kind": "exit", "params": {"code": 0}})
                    assert answer.status_code == 202, answer.text
                    ids.append(answer.json()["job_id"])
                if path == "/api/jobs/reconcile":
                    # Unpaused behind the server's back (another process on the box): nothing wakes its drainer, so
                    # the operator's reconcile is what starts the jobs.
                    await registry.set_paused(False, by="operator")
                await _hang_up(url, path, delay_s)
                # The client that hung up cannot know how far its request went: it sends it again. A request the
                # server had not begun left the queue as it found it; one it had begun finished in the server's own
                # tasks. Either way every job then runs once and ends.
                assert (await client.post(f"{url}{path}")).status_code == 200
                rows = await poll(lambda ids=ids: _all_done(client, url, ids), timeout_s=30)
                assert [(r["status"], r["attempts"]) for r in rows] == [("succeeded", 1)] * SLOTS, (delay_s, rows)
        queue = (await client.get(f"{url}/api/queue")).json()
        assert (queue["running"], queue["queued"]) == (0, 0)
        jobs = (await client.get(f"{url}/api/jobs", params={"limit": 1000})).json()["jobs"]
        assert len(jobs) == len(DELAYS_S) * ROUNDS * SLOTS  # nothing made twice
