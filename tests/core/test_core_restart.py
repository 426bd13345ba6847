"""End to end with the real ``supervisor serve`` process: SIGKILL it while jobs run, restart, and check that
nothing is lost and nothing runs twice. These exercise every reconcile rule across a real boot boundary."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest
import trio
from core_helpers import KINDS, pid_of, poll, serve_env  # type: ignore[import-not-found]

from supervisor import Config, Job, JobStatus, Liveness, SqliteRegistry
from supervisor.domain import PageRequest, parse_kind
from supervisor.execution.subprocess import JobFiles, identity_of, probe, read_start
from supervisor.registry import NewJob


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return serve_env(tmp_path, PODCAST_JOB_MAX_CONCURRENT="2")


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SqliteRegistry]:
    reg = SqliteRegistry(tmp_path / "data" / ".viewer" / "jobs.sqlite3")
    yield reg
    # Jobs outlive supervisors by design: whatever a test left running is stopped here.
    for job in await reg.running_jobs():
        if pid_of(job) is not None and probe_alive(job):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid_of(job), signal.SIGKILL)
    await reg.aclose()


def probe_alive(job: Job) -> bool:
    identity = identity_of(job)
    return identity is not None and probe(identity) is Liveness.ALIVE


async def _enqueue(registry: SqliteRegistry, kind: str, params: dict[str, object]) -> str:
    """Enqueue as another process would (a CLI, the pipeline container): straight into the registry."""
    parsed = parse_kind(kind, tomllib.loads(KINDS)["kinds"][kind])
    validated = parsed.validate_params(params)
    result = await registry.enqueue(NewJob(kind, validated, parsed.render_argv(validated)))
    return result.job.job_id


async def _rows(registry: SqliteRegistry) -> dict[str, Job]:
    jobs, _ = await registry.list_jobs(PageRequest.parse(limit=1000))
    return {j.job_id: j for j in jobs}


async def test_supervisor_sigkilled_and_restarted_keeps_live_jobs_fails_dead_ones_and_continues_the_queue(
    start_server: Callable[[], trio.Process], registry: SqliteRegistry
) -> None:
    a = await _enqueue(registry, "sleep", {"seconds": 60})
    b = await _enqueue(registry, "sleep", {"seconds": 60})
    c = await _enqueue(registry, "exit", {"code": 0})

    first = await start_server()  # type: ignore[misc]

    async def both_running() -> dict[str, Job] | None:
        rows = await _rows(registry)
        return rows if all(rows[j].status is JobStatus.RUNNING and pid_of(rows[j]) for j in (a, b)) else None

    before = await poll(both_running)
    assert before[c].status is JobStatus.QUEUED  # max_concurrent = 2
    first.proc.kill()  # SIGKILL: no finalizer, no shutdown hook runs
    await first.proc.wait()

    # Jobs outlive a supervisor crash: both are still alive, and their log readers with them.
    assert probe_alive(before[a]) and probe_alive(before[b])
    assert pid_of(before[b]) is not None
    os.kill(pid_of(before[b]), signal.SIGKILL)  # b dies while no supervisor is watching

    async def b_gone() -> bool | None:
        return (not probe_alive(before[b])) or None

    await poll(b_gone)
    second = await start_server()  # type: ignore[misc]
    # The startup sweep ran before serving: by now b is failed and its slot went to c. The first boot's shepherd
    # (alive: it still has a) reaped b and recorded how it ended: its true outcome, not an orphan guess.
    rows = await _rows(registry)
    assert (rows[b].status, rows[b].error_reason, rows[b].exit_code) == (JobStatus.FAILED, "killed_by_SIGKILL", -9)
    assert rows[c].status in (JobStatus.RUNNING, JobStatus.SUCCEEDED)
    # a is alive: it keeps its slot (INV-UNKNOWN-KEEPS-SLOT's sibling: alive is alive) and is not run twice.
    assert rows[a].status is JobStatus.RUNNING
    assert (pid_of(rows[a]), rows[a].attempts, rows[a].boot_id) == (pid_of(before[a]), 1, before[a].boot_id)
    assert len(rows) == 3

    async def c_done() -> Job | None:
        row = (await _rows(registry))[c]
        return row if row.status.is_terminal else None

    assert (await poll(c_done)).status is JobStatus.SUCCEEDED
    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{second.url}/api/health")).json()["status"] == "ok"

    # Now a dies too; the new boot adopted it at startup (its monitor waits on a pidfd), so its end is noticed at
    # once, with the outcome the first shepherd recorded.
    assert pid_of(before[a]) is not None
    os.killpg(pid_of(before[a]), signal.SIGKILL)

    async def a_failed() -> Job | None:
        row = (await _rows(registry))[a]
        return row if row.status.is_terminal else None

    failed = await poll(a_failed, timeout_s=10)
    assert (failed.status, failed.error_reason) == (JobStatus.FAILED, "killed_by_SIGKILL")
    second.proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await second.proc.wait() == 0


async def test_health_answers_at_boot_while_the_promoted_job_runs_and_shutdown_leaves_it_running(
    start_server: Callable[[], trio.Process], registry: SqliteRegistry
) -> None:
    job_id = await _enqueue(registry, "sleep", {"seconds": 60})
    server = await start_server()  # type: ignore[misc]
    async with httpx.AsyncClient(timeout=5) as client:
        health = await client.get(f"{server.url}/api/health")
    assert health.status_code == 200
    row = (await _rows(registry))[job_id]
    assert row.status is JobStatus.RUNNING and probe_alive(row)
    server.proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await server.proc.wait() == 0
    # A supervisor shutdown never kills a job: the next boot reconciles it.
    assert probe_alive(row)
    assert (await _rows(registry))[job_id].status is JobStatus.RUNNING


async def test_cancel_after_a_restart_signals_the_verified_prior_boot_process_INV_NEVER_BLIND_SIGNAL(
    start_server: Callable[[], trio.Process], registry: SqliteRegistry
) -> None:
    job_id = await _enqueue(registry, "sleep", {"seconds": 60})
    first = await start_server()  # type: ignore[misc]

    async def running() -> Job | None:
        row = (await _rows(registry))[job_id]
        return row if row.status is JobStatus.RUNNING and pid_of(row) else None

    before = await poll(running)
    first.proc.kill()
    await first.proc.wait()
    second = await start_server()  # type: ignore[misc]
    async with httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(f"{second.url}/api/jobs/{job_id}/cancel")
    assert answer.status_code == 200
    assert answer.json()["status"] in ("running", "cancelled")  # signalled; cancelled once the process is gone

    async def cancelled() -> Job | None:
        row = (await _rows(registry))[job_id]
        return row if row.status.is_terminal else None

    row = await poll(cancelled, timeout_s=10)
    assert (row.status, row.error_reason) == (JobStatus.CANCELLED, "cancelled")
    assert not probe_alive(before)  # the prior boot's job, verified by identity, was stopped
    second.proc.send_signal(signal.SIGTERM)
    with trio.fail_after(10):
        assert await second.proc.wait() == 0


async def _all_with(registry: SqliteRegistry, ids: tuple[str, ...], status: JobStatus) -> dict[str, Job] | None:
    rows = await _rows(registry)
    return rows if all(rows[j].status is status and pid_of(rows[j]) for j in ids) else None


async def test_jobs_ending_while_no_supervisor_runs_get_their_true_outcome_at_the_next_boot(
    start_server: Callable[[], trio.Process], registry: SqliteRegistry, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    ok = await _enqueue(registry, "gated", {"gate": str(gate), "code": 0})
    bad = await _enqueue(registry, "gated", {"gate": str(gate), "code": 7})
    first = await start_server()  # type: ignore[misc]
    before = await poll(lambda: _all_with(registry, (ok, bad), JobStatus.RUNNING))
    first.proc.kill()  # SIGKILL: the supervisor is gone, its shepherd and jobs are not
    await first.proc.wait()
    run_dirs = Config(data_dir=registry.path.parent.parent).run_dirs()
    start = read_start(JobFiles.for_job(before[ok], registry.path.parent / "jobs", run_dirs[0] if run_dirs else None))
    assert start is not None and start.shepherd is not None
    shepherd = start.shepherd
    gate.write_text("open")  # both jobs now end while no supervisor runs

    async def shepherd_gone() -> bool | None:
        return True if probe(shepherd) is Liveness.DEAD else None

    # The orphaned shepherd reaps both, records their exits, and leaves once it has no job.
    await poll(shepherd_gone, timeout_s=20)
    assert (await _rows(registry))[ok].status is JobStatus.RUNNING  # nobody has judged them yet

    await start_server()  # type: ignore[misc]
    rows = await _rows(registry)
    # INV-TRUE-OUTCOME: the outcomes the shepherd recorded, not orphan_reconciled_dead_pid; no second run.
    assert (rows[ok].status, rows[ok].error_reason, rows[ok].exit_code, rows[ok].attempts) == (
        JobStatus.SUCCEEDED,
        None,
        0,
        1,
    )
    assert (rows[bad].status, rows[bad].error_reason, rows[bad].exit_code, rows[bad].attempts) == (
        JobStatus.FAILED,
        "exit_code_7",
        7,
        1,
    )
    # The success's `then` kind fired: exactly one follow-up, and it runs.
    follow_ups = [j for j in rows.values() if j.kind == "done"]
    assert len(follow_ups) == 1

    async def follow_up_done() -> Job | None:
        row = (await _rows(registry))[follow_ups[0].job_id]
        return row if row.status.is_terminal else None

    assert (await poll(follow_up_done)).status is JobStatus.SUCCEEDED


async def test_an_adopted_job_heartbeats_to_the_new_boot_and_can_be_cancelled(
    start_server: Callable[[], trio.Process], registry: SqliteRegistry, env: dict[str, str]
) -> None:
    with socket.socket() as probe_sock:  # one port for both boots: the job keeps the heartbeat URL it was given
        probe_sock.bind(("127.0.0.1", 0))
        port = probe_sock.getsockname()[1]
    env["PODCAST_JOB_BIND"] = f"127.0.0.1:{port}"
    job_id = await _enqueue(registry, "steady_beater", {})
    first = await start_server()  # type: ignore[misc]

    async def beating(minimum: int) -> Job | None:
        row = (await _rows(registry))[job_id]
        return row if row.completed_units >= minimum else None

    before = await poll(lambda: beating(2))
    first.proc.kill()
    await first.proc.wait()
    units_then = (await _rows(registry))[job_id].completed_units

    second = await start_server()  # type: ignore[misc]
    # Accepted by the new boot: the row's progress moves on with the same job token.
    after = await poll(lambda: beating(units_then + 3))
    assert (after.status, pid_of(after), after.attempts, after.boot_id) == (
        JobStatus.RUNNING,
        pid_of(before),
        1,
        before.boot_id,
    )
    async with httpx.AsyncClient(base_url=second.url, timeout=5) as client:
        answer = await client.post(f"/api/jobs/{job_id}/cancel", timeout=5)
        assert answer.status_code == 200

    async def ended() -> Job | None:
        row = (await _rows(registry))[job_id]
        return row if row.status.is_terminal else None

    done = await poll(ended, timeout_s=20)
    assert (done.status, done.error_reason) == (JobStatus.CANCELLED, "cancelled")
    assert not probe_alive(before)


def _started_line(log: Path) -> dict[str, object]:
    [line] = [json.loads(text) for text in log.read_text().splitlines() if '"supervisor_started"' in text]
    return dict(line)


async def test_a_crash_restarted_box_leads_at_once_for_its_previous_boot_is_proved_gone(
    start_server: Callable[[], trio.Process], registry: SqliteRegistry, tmp_path: Path
) -> None:
    """After a SIGKILL the restarted boot waited out its dead boot's lease (15 s by default) before it led,
    and so before it sent a webhook, pruned or watched silent hosts. The data dir's lock proves that boot gone: the
    new boot takes its lead at its first renewal, before it serves."""
    first = await start_server()  # type: ignore[misc]
    assert _started_line(first.log)["leader"] is True
    lock = tmp_path / "data" / ".viewer" / "supervisor.lock"
    first_boot = lock.read_text()
    assert _started_line(first.log)["boot_id"] == first_boot
    first.proc.kill()  # SIGKILL: its lease and its lead stay in the registry, unexpired
    await first.proc.wait()
    second = await start_server()  # type: ignore[misc]
    started = _started_line(second.log)
    assert started["leader"] is True  # at once, not 15 s later
    assert lock.read_text() == started["boot_id"] != first_boot
    [restarted] = [json.loads(t) for t in second.log.read_text().splitlines() if '"host_restarted"' in t]
    assert restarted["previous_boot_id"] == first_boot
    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{second.url}/api/health")).json()["leader"] is True
