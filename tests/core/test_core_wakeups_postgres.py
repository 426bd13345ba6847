"""Wake-ups across a fleet (ADR 0012 §7): real ``supervisor serve`` processes on one PostgreSQL schema.

With a sweep interval far longer than the test's bounds, polling cannot explain what happens: the hosts' sweep
counts are checked unchanged.

- a job enqueued through a host that is full (its own cap, ``PODCAST_JOB_HOST_MAX_CONCURRENT=1``) is started by
  another host with a free slot, woken by the enqueue's NOTIFY;
- a cancel through a host of a job that runs on another is carried out by its owner at once (woken by NOTIFY), and
  the row ends ``cancelled`` only once the job's program is gone (its own marker files say it took the SIGTERM);
- a lost notification only delays (INV-NOTIFY-IS-A-HINT): the listening sessions are ended by the server
  (``pg_terminate_backend`` on the sessions whose application_name and last query show the channel); the
  supervisors stay up, say so once (WARNING), listen again (INFO), and a job enqueued meanwhile still starts.

The fleet, its hosts and its kinds are ``test_core_fleet_postgres``'s.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import trio
from test_core_fleet_postgres import (  # type: ignore[import-not-found]
    Fleet,
    Host,
    fleet,
    sql,
    until,
    until_cancelled,
)

pytestmark = [pytest.mark.postgres, pytest.mark.e2e]
__all__ = ["fleet"]  # the fixture, used by name

LONG_SWEEP_S = 60  # no sweep comes within a test's bounds after the startup one
SHORT_SWEEP_S = 4  # the fallback's test: the sweep is the guarantee
HINT_BOUND_S = 15.0  # far under LONG_SWEEP_S: a backstop for a loaded machine, not a speed claim
LISTEN_APP = "podcast-job-supervisor-listen"


async def _fetchval(dsn: str, query: str) -> Any:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


def fetchval(dsn: str, query: str) -> Any:
    """One value, on a connection of its own in a thread's own asyncio loop (the supervisors are other processes)."""
    return asyncio.run(_fetchval(dsn, query))


def full_at_one(sweep_s: float) -> dict[str, str]:
    return {"PODCAST_JOB_HOST_MAX_CONCURRENT": "1", "PODCAST_JOB_SWEEP_SECONDS": str(sweep_s)}


async def row_where(fleet: Fleet, via: Host, job_id: str, **wanted: Any) -> dict[str, Any] | None:
    row = await fleet.job(via, job_id)
    return row if all(row[k] == v for k, v in wanted.items()) else None


async def fill(fleet: Fleet, hosts: list[Host], gate: Path) -> Host:
    """A gated job through the first host; whichever host runs it is full (its cap is 1). That host."""
    job_id = await fleet.enqueue(hosts[0], "gated", gate=str(gate), code=0)

    async def running() -> dict[str, Any] | None:
        return await row_where(fleet, hosts[0], job_id, status="running")

    row = await until(running, what="the filler running")
    return fleet.hosts[row["host_id"]]


async def test_an_enqueue_through_a_full_host_is_started_by_another_and_a_cancel_through_it_is_carried_out_at_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    hosts = [await fleet.start(h, env_extra=full_at_one(LONG_SWEEP_S)) for h in ("h1", "h2")]
    full = await fill(fleet, hosts, tmp_path / "gate")
    free = next(host for host in hosts if host is not full)
    swept = {host.host_id: await fleet.sweeps(host) for host in hosts}  # the startup sweeps

    # Through the full host: it cannot start it; the other hears the enqueue and starts it now.
    marker = tmp_path / "slow"
    job_id = await fleet.enqueue(full, "slow_to_stop", marker=str(marker))

    async def started() -> dict[str, Any] | None:
        row = await row_where(fleet, full, job_id, status="running")
        return row if row is not None and await trio.Path(f"{marker}.started").exists() else None

    row = await until(started, what="the job started by the free host", limit_s=HINT_BOUND_S)
    assert row["host_id"] == free.host_id

    # The cancel through the full host: the free host, which runs it, is woken and stops it. The row first, then the
    # processes: a row that says cancelled while its program still runs is the bug.
    answer = await fleet.post(full, f"/api/jobs/{job_id}/cancel")
    assert (answer["status"], answer["cancel_requested"]) == ("running", True), answer
    row, running_while_stopping = await until_cancelled(fleet, full, job_id, marker, limit_s=HINT_BOUND_S)
    assert await trio.Path(f"{marker}.term").exists()  # the job's own word: it was stopped by a SIGTERM
    assert running_while_stopping > 0, "the stop was never seen under way: the test proved nothing"
    assert row["host_id"] == free.host_id

    # Neither host swept meanwhile: the wake-ups did it, not the polling.
    assert {host.host_id: await fleet.sweeps(host) for host in hosts} == swept
    assert fleet.errors() == []


async def test_INV_NOTIFY_IS_A_HINT_a_lost_listening_session_only_delays(fleet: Fleet, tmp_path: Path) -> None:
    hosts = [await fleet.start(h, env_extra=full_at_one(SHORT_SWEEP_S)) for h in ("h1", "h2")]
    full = await fill(fleet, hosts, tmp_path / "gate")
    free = next(host for host in hosts if host is not full)
    schema = fleet.database_url.rsplit("search_path=", 1)[1]
    listens = (
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{LISTEN_APP}' "
        f"AND query LIKE '%podcast_jobs.{schema}%'"  # its LISTEN, or its check, names the channel
    )
    dsn = os.environ["PODCAST_JOB_TEST_DATABASE_URL"]

    # The server ends both hosts' listening sessions (this schema's only: other tests listen too).
    await trio.to_thread.run_sync(sql, dsn, listens)
    job_id = await fleet.enqueue(full, "gated", gate=str(tmp_path / "gate2"), code=0)  # meanwhile

    async def started() -> dict[str, Any] | None:
        return await row_where(fleet, full, job_id, status="running")

    row = await until(started, what="the job enqueued meanwhile to start", limit_s=3 * SHORT_SWEEP_S + 10)
    assert row["host_id"] == free.host_id

    async def back(host: Host) -> bool:
        return bool(host.lines("wakeups_back"))

    for host in hosts:
        await until(lambda host=host: back(host), what=f"{host.host_id} listening again")
        [lost] = host.lines("wakeups_lost")  # said once
        assert lost["level"] == "warning" and "listening session ended" in lost["error"], lost
        [again] = host.lines("wakeups_back")
        assert again["level"] == "info", again
        assert host.proc.returncode is None  # never a reason to stop
        assert (await fleet.get(host, "/api/health"))["status"] == "ok"

    # Listening again: both hosts' sessions are back on this schema's channel.
    count = await trio.to_thread.run_sync(fetchval, dsn, listens.replace("pg_terminate_backend(pid)", "COUNT(*)"))
    assert count == len(hosts), count
    assert fleet.errors() == []
