"""End to end (ADR 0019) with the real ``supervisor serve``: a job that works is never judged stalled or silent, and
never stopped for it -- not after an operator read it (the heartbeat writer), not for the supervisor's own outage (a
restart longer than the thresholds, a SIGSTOP) -- while a job truly stalled is still flagged, a threshold and a sweep
after the new boot.

The rows are read straight from the registry's file: a read that writes no pending beat first, as the sweeper's
judgement and ``/metrics`` were before the fix. The jobs are real processes beating over real HTTP.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from core_helpers import KINDS, pid_of, poll, serve_env  # type: ignore[import-not-found]

from supervisor import Job, JobStatus, SqliteRegistry
from supervisor.domain import parse_kind
from supervisor.execution.subprocess import identity_of, probe
from supervisor.registry import NewJob

pytestmark = pytest.mark.e2e

THRESHOLD_S = 3.0
# A job that beats every 0.1 s without ever progressing: truly stalled, and alive.
SPINNER = '''
[kinds.spinner]
argv = ["{python}", "-c", """
import json, os, threading, urllib.request
while True:
    req = urllib.request.Request(os.environ['PODCAST_JOB_HEARTBEAT_URL'], method='POST',
        data=json.dumps({'completed_units': 1}).encode(),
        headers={'Authorization': 'Bearer ' + os.environ['PODCAST_JOB_TOKEN'], 'Content-Type': 'application/json'})
    try:
        urllib.request.urlopen(req, timeout=2).read()
    except Exception:
        pass
    threading.Event().wait(0.1)
"""]
'''
ALL_KINDS = KINDS + SPINNER


def _free_port() -> int:
    with socket.socket() as sock:  # one port for every boot: a job keeps the heartbeat URL it was given
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    action = getattr(request, "param", "terminate")
    return serve_env(
        tmp_path,
        ALL_KINDS,
        PODCAST_JOB_BIND=f"127.0.0.1:{_free_port()}",
        PODCAST_JOB_PROGRESS_STALE_SECONDS=str(THRESHOLD_S),
        PODCAST_JOB_SILENT_SECONDS=str(THRESHOLD_S),
        PODCAST_JOB_STALL_ACTION=action,
        PODCAST_JOB_CANCEL_GRACE_SECONDS="1",
    )


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SqliteRegistry]:
    reg = SqliteRegistry(tmp_path / "data" / ".viewer" / "jobs.sqlite3")
    yield reg
    for job in await reg.running_jobs():  # jobs outlive supervisors by design: stop what the test left
        identity = identity_of(job)
        if pid_of(job) is not None and identity is not None and probe(identity).value == "alive":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid_of(job), signal.SIGKILL)
    await reg.aclose()


async def _enqueue(registry: SqliteRegistry, kind: str) -> str:
    parsed = parse_kind(kind, tomllib.loads(ALL_KINDS)["kinds"][kind])
    validated = parsed.validate_params({})
    return (await registry.enqueue(NewJob(kind, validated, parsed.render_argv(validated)))).job.job_id


async def _row(registry: SqliteRegistry, job_id: str) -> Job:
    return await registry.get(job_id)


async def _progressing(registry: SqliteRegistry, job_id: str, above: int) -> Job:
    async def check() -> Job | None:
        row = await _row(registry, job_id)
        return row if row.status is JobStatus.RUNNING and row.completed_units > above else None

    return await poll(check, timeout_s=20)


async def _watch_working(registry: SqliteRegistry, job_id: str, seconds: float) -> Job:
    """For ``seconds`` (longer than the thresholds), every look at the row: running, not flagged, and its watermark
    in the registry rising (its beats reach the registry with no read through the API)."""
    first = last = await _row(registry, job_id)
    with trio.move_on_after(seconds):
        while True:
            last = await _row(registry, job_id)
            assert last.status is JobStatus.RUNNING, f"a working job was ended: {last.status} {last.error_reason}"
            assert not last.stalled and not last.silent, f"a working job was flagged: {last}"
            await trio.sleep(0.2)  # a real process in another program: polled
    assert last.completed_units > first.completed_units + 10, "its beats stopped reaching the registry"
    return last


def _events(log: Path, *names: str) -> list[dict[str, Any]]:
    lines = [json.loads(t) for t in log.read_text().splitlines() if t.startswith("{")]
    return [line for line in lines if line.get("event") in names]


@pytest.mark.parametrize("env", ["alert", "terminate"], indirect=True)
async def test_INV_A_BEAT_TAKEN_IS_WRITTEN_a_progressing_job_read_then_left_alone_is_never_flagged(
    start_server: Callable[[], Any], registry: SqliteRegistry, env: dict[str, str]
) -> None:
    job_id = await _enqueue(registry, "steady_beater")
    server = await start_server()
    await _progressing(registry, job_id, 2)
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as client:
        # The operator looks a few times (supervisor show, a short jobs --watch), then nobody reads. (The defect
        # needed a read while the writer waited for beats: about one read in two met it.)
        for _ in range(10):
            assert (await client.get(f"/api/jobs/{job_id}", timeout=5)).json()["status"] == "running"
            await trio.sleep(0.03)  # paced as a person's reads, at varied phases of the writer's interval
    await _watch_working(registry, job_id, THRESHOLD_S + 2)
    assert _events(server.log, "job_stalled", "job_silent") == []


async def test_INV_OWN_ABSENCE_NOT_THE_JOBS_an_outage_longer_than_the_thresholds_flags_and_stops_no_working_job(
    start_server: Callable[[], Any], registry: SqliteRegistry
) -> None:
    job_id = await _enqueue(registry, "steady_beater")
    first = await start_server()
    before = await _progressing(registry, job_id, 2)
    first.proc.kill()  # a crash, an upgrade: no supervisor takes a beat for longer than both thresholds
    await first.proc.wait()
    await trio.sleep(THRESHOLD_S + 2)  # the outage itself: a duration of the scenario, not a wait for an event
    second = await start_server()
    after = await _watch_working(registry, job_id, THRESHOLD_S + 2)
    assert (pid_of(after), after.attempts) == (pid_of(before), 1)  # the same process throughout: never stopped
    assert _events(second.log, "job_stalled", "job_silent") == []


async def test_INV_OWN_ABSENCE_NOT_THE_JOBS_a_frozen_supervisor_flags_and_stops_no_working_job(
    start_server: Callable[[], Any], registry: SqliteRegistry
) -> None:
    job_id = await _enqueue(registry, "steady_beater")
    server = await start_server()
    before = await _progressing(registry, job_id, 2)
    server.proc.send_signal(signal.SIGSTOP)  # swapped out, frozen: its timers all fire late when it wakes
    try:
        await trio.sleep(THRESHOLD_S * 2)  # the freeze itself: a duration of the scenario
    finally:
        server.proc.send_signal(signal.SIGCONT)
    after = await _watch_working(registry, job_id, THRESHOLD_S + 2)
    assert (pid_of(after), after.attempts) == (pid_of(before), 1)
    assert _events(server.log, "job_stalled", "job_silent") == []
    [absent] = _events(server.log, "supervisor_was_absent")
    assert absent["absent_s"] >= THRESHOLD_S * 2 - 1


async def test_INV_OWN_ABSENCE_NOT_THE_JOBS_a_truly_stalled_job_is_still_flagged_a_threshold_after_the_new_boot(
    start_server: Callable[[], Any], registry: SqliteRegistry
) -> None:
    job_id = await _enqueue(registry, "spinner")
    first = await start_server()

    async def beating() -> Job | None:
        row = await _row(registry, job_id)
        return row if row.last_heartbeat_at is not None else None

    await poll(beating)
    first.proc.kill()  # before its threshold: not yet flagged
    await first.proc.wait()
    assert not (await _row(registry, job_id)).stalled
    await trio.sleep(THRESHOLD_S + 1)  # the outage itself: its stamps age past the threshold meanwhile
    started = trio.current_time()
    second = await start_server()

    async def ended() -> Job | None:
        row = await _row(registry, job_id)
        return row if row.status.is_terminal else None

    final = await poll(ended, timeout_s=30)
    took = trio.current_time() - started
    # Stopped by the terminate action: judged on the new boot's own watch, a threshold (plus a sweep, a grace and a
    # start-up) after it began, never at its first sweep for the time no supervisor ran.
    assert (final.status, final.error_reason) == (JobStatus.STALE, "progress_stalled")
    assert THRESHOLD_S <= took <= THRESHOLD_S + 1 + 1 + 10
    [stalled] = _events(second.log, "job_stalled")
    assert stalled["progress_age_s"] > THRESHOLD_S
