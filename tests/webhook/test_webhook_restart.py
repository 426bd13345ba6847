"""Webhooks across real ``supervisor serve`` restarts: events of reconcile and adoption after a SIGKILL, and events
left undelivered by a SIGKILLed supervisor delivered by the next boot (at least once, in order)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from webhook_helpers import KINDS, SECRET, Receiver, statuses

from supervisor import JobStatus, SqliteRegistry

pytestmark = pytest.mark.e2e

WAIT_S = 30.0
REPO_ROOT = Path(__file__).resolve().parents[2]


class Server:
    def __init__(self, proc: trio.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.url = ""
        self.boot_id = ""


Start = Callable[[], Awaitable[Server]]


@pytest.fixture
def env(tmp_path: Path, receiver: Receiver) -> dict[str, str]:
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    out = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    out.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), out.get("PYTHONPATH", "")) if p),
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND="127.0.0.1:0",
        PODCAST_JOB_KINDS_FILE=str(kinds),
        PODCAST_JOB_MAX_CONCURRENT="2",
        PODCAST_JOB_SWEEP_SECONDS="1",
        PODCAST_JOB_WEBHOOK_URL=receiver.url,
        PODCAST_JOB_WEBHOOK_SECRET=SECRET,
        PODCAST_JOB_WEBHOOK_TIMEOUT_SEC="1",
        # The webhook sender is the leader's; a boot restarted after a SIGKILL leads once the dead boot's lease has
        # expired (ADR 0012: never two leaders): the shortest lease keeps that wait short.
        PODCAST_JOB_HOST_LEASE_SECONDS="3",
    )
    return out


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SqliteRegistry]:
    reg = SqliteRegistry(tmp_path / "data" / ".viewer" / "jobs.sqlite3")
    yield reg
    await reg.aclose()


@pytest.fixture
async def start_server(tmp_path: Path, env: dict[str, str]) -> AsyncIterator[Start]:
    servers: list[Server] = []

    async def start() -> Server:
        log = tmp_path / f"supervisor-{len(servers)}.log"
        with log.open("wb") as fh:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "supervisor", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=fh
            )
        server = Server(proc, log)
        servers.append(server)
        with trio.fail_after(WAIT_S):
            while not server.url:
                for line in (await trio.to_thread.run_sync(log.read_text)).splitlines():
                    if '"supervisor_started"' in line:
                        started = json.loads(line)
                        server.url, server.boot_id = started["url"], started["boot_id"]
                if proc.returncode is not None:
                    raise AssertionError(f"supervisor exited {proc.returncode}: {log.read_text()}")
                await trio.sleep(0.05)  # polling another process's log, under the deadline above
        return server

    yield start
    for server in servers:
        if server.proc.returncode is None:
            server.proc.send_signal(signal.SIGTERM)
        with trio.fail_after(WAIT_S):
            await server.proc.wait()


async def _row_where(registry: SqliteRegistry, job_id: str, check: Callable[[Any], bool]) -> Any:
    with trio.fail_after(WAIT_S):
        while not check(row := await registry.get(job_id)):  # noqa: ASYNC110
            await trio.sleep(0.05)  # another process's job: polled, under the deadline above
        return row


async def _sigkill(server: Server) -> None:
    server.proc.kill()
    await server.proc.wait()


async def test_reconcile_and_adoption_events_after_a_sigkilled_supervisor_restarts(
    receiver: Receiver, start_server: Start, registry: SqliteRegistry, env: dict[str, str]
) -> None:
    env["PODCAST_JOB_STALE_SECONDS"] = "1"  # the operator's reconcile may evict a live job after 1 s
    first = await start_server()
    async with httpx.AsyncClient(timeout=10) as client:
        ids = []
        for _ in range(2):
            answer = await client.post(f"{first.url}/api/jobs", json={"kind": "sleep", "params": {"seconds": 60}})
            ids.append(answer.json()["job_id"])
    killed, kept = ids
    rows = [await _row_where(registry, job_id, lambda r: r.identity is not None) for job_id in ids]
    try:
        await _sigkill(first)
        killed_pid = rows[0].identity.fields['pid']
        os.kill(killed_pid, signal.SIGKILL)  # dies while no supervisor runs: its shepherd records how
        second = await start_server()
        # The startup sweep finalized the dead job with its true outcome and adopted the live one.
        await _row_where(registry, killed, lambda r: r.status is JobStatus.FAILED)
        async with httpx.AsyncClient(timeout=10) as client:
            # The operator's reconcile, once the job is past the 1 s window (wall clock, so polled).
            with trio.fail_after(WAIT_S):
                while (await client.post(f"{second.url}/api/jobs/reconcile")).json()["updated"] == 0:  # noqa: ASYNC110
                    await trio.sleep(0.2)
        with trio.fail_after(WAIT_S):
            await receiver.wait_for(lambda r: statuses(r.events(), kept)[-1:] == ["job.transition:stale"])
            await receiver.wait_for(lambda r: statuses(r.events(), killed)[-1:] == ["job.transition:failed"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rows[1].identity.fields['pid'], signal.SIGKILL)  # a stale job's process is left alone by design
    events = receiver.events()
    assert statuses(events, killed) == ["job.transition:queued", "job.transition:running", "job.transition:failed"]
    assert statuses(events, kept) == [
        "job.transition:queued", "job.transition:running", "job.adopted", "job.transition:stale"
    ]
    by = {(p["job"]["job_id"], p["event"], p["job"]["status"]): p for p in events}
    reconciled = by[(killed, "job.transition", "failed")]
    assert (reconciled["reason"], reconciled["boot_id"]) == ("killed_by_SIGKILL", second.boot_id)
    assert by[(kept, "job.adopted", "running")]["boot_id"] == second.boot_id
    assert by[(kept, "job.transition", "stale")]["reason"] == "wall_clock_stale"
    assert by[(kept, "job.transition", "running")]["boot_id"] == first.boot_id
    assert all(d.signed_by(SECRET) for d in receiver.accepted)


async def test_events_undelivered_when_the_supervisor_is_sigkilled_are_delivered_after_it_restarts(
    receiver: Receiver, start_server: Start, registry: SqliteRegistry
) -> None:
    receiver.behaviour = "fail"
    first = await start_server()
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(f"{first.url}/api/jobs", json={"kind": "exit", "params": {"code": 0}})
    job_id = answer.json()["job_id"]
    await _row_where(registry, job_id, lambda r: r.status is JobStatus.SUCCEEDED)
    with trio.fail_after(WAIT_S):
        await receiver.wait_for(lambda r: len(r.requests) >= 1)  # tried, and refused
    await _sigkill(first)
    assert receiver.accepted == []
    assert len(await registry.outbox_pending(100)) == 3
    receiver.behaviour = "ok"
    await start_server()
    with trio.fail_after(WAIT_S):
        await receiver.wait_for(lambda r: len(r.events()) == 3)
    assert statuses(receiver.events(), job_id) == [
        "job.transition:queued", "job.transition:running", "job.transition:succeeded"
    ]
    assert {p["boot_id"] for p in receiver.events()} == {first.boot_id}  # written by the boot that made the change
    with trio.fail_after(WAIT_S):
        while await registry.outbox_depth():  # noqa: ASYNC110 - another process deletes
            await trio.sleep(0.05)
