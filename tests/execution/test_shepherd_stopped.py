"""ADR 0014, with the real shepherd: a start whose outcome is unknown is never recorded ``failed``.

The shepherd stopped (SIGSTOP, as a hung or swapped-out process is) while a job is promoted: its start is sent and not
answered. Before the fix, the row ended ``failed / spawn_failed: the shepherd did not answer within 30 s`` and its slot
was freed; on SIGCONT the shepherd started the program it still held, which ran to its end unwatched. Now the row
keeps its slot, running with its liveness unknown, until the evidence says which: the job is adopted once it runs
(SIGCONT), or goes back to the queue once it provably never will (the stopped shepherd killed)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest
from core_helpers import poll, wait_terminal  # type: ignore[import-not-found]

from supervisor import Job, JobStatus, Supervisor
from supervisor.execution import subprocess as subprocess_executor
from supervisor.execution.subprocess import SubprocessExecutor

START_TIMEOUT_S = 1.0  # the shepherd's answer is awaited this long here (30 s in production)


async def _stopped_shepherd_and_a_start_given_up(sup: Supervisor) -> tuple[int, Job]:
    """The shepherd up (a first job run through it), then stopped; a job promoted and its start given up on."""
    first = (await sup.enqueue("exit", {"code": 0})).job
    assert (await wait_terminal(sup, first.job_id)).status is JobStatus.SUCCEEDED
    executor = sup.executor
    assert isinstance(executor, SubprocessExecutor) and executor.shepherd.pid is not None
    shepherd = executor.shepherd.pid
    os.kill(shepherd, signal.SIGSTOP)
    job = (await sup.enqueue("exit", {"code": 0})).job

    async def given_up() -> Job | None:
        row = await sup.get(job.job_id)
        held = sup.boot.ledger.being_started(job.job_id)
        return row if row.status is JobStatus.RUNNING and not held else None

    row = await poll(given_up, timeout_s=20)
    assert (row.status, row.spawned, row.error_reason) == (JobStatus.RUNNING, False, None)  # never failed
    return shepherd, row


@pytest.fixture
def short_start_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess_executor, "START_TIMEOUT_S", START_TIMEOUT_S)


@pytest.mark.usefixtures("short_start_timeout")
async def test_a_start_the_stopped_shepherd_makes_late_is_adopted_and_recorded_as_it_ran(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(max_concurrent=1)
    shepherd, row = await _stopped_shepherd_and_a_start_given_up(sup)
    try:
        behind = (await sup.enqueue("exit", {"code": 0})).job
        # INV-UNKNOWN-KEEPS-SLOT: the sweeps keep it (its start may still happen) and the job behind it waits.
        for _ in range(2):
            report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
            [detail] = [d for d in report.details if d.job_id == row.job_id]
            assert (detail.action, detail.reason, detail.liveness) == ("keep", "liveness_unknown_kept", "unknown")
        await sup.sweeper.sweep()
        assert (await sup.get(behind.job_id)).status is JobStatus.QUEUED
    finally:
        os.kill(shepherd, signal.SIGCONT)  # the shepherd starts the program it held

    async def ended() -> Job | None:
        await sup.sweeper.sweep()  # what the sweeper does every sweep_interval_s: the late start is found and judged
        job = await sup.get(row.job_id)
        return job if job.status.is_terminal else None

    final = await poll(ended, timeout_s=20)
    assert (final.status, final.error_reason, final.exit_code, final.attempts) == (JobStatus.SUCCEEDED, None, 0, 1)
    assert await sup.read_log(row.job_id) == b"bye\n"  # it ran once, and its row says what it did
    assert (await wait_terminal(sup, behind.job_id)).status is JobStatus.SUCCEEDED


@pytest.mark.usefixtures("short_start_timeout")
async def test_a_start_the_stopped_shepherd_never_makes_goes_back_to_the_queue_and_runs_once(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(max_concurrent=1)
    shepherd, row = await _stopped_shepherd_and_a_start_given_up(sup)
    os.kill(shepherd, signal.SIGKILL)  # it never reads the start it was sent: the start provably never happens

    async def ended() -> Job | None:
        await sup.sweeper.sweep()
        job = await sup.get(row.job_id)
        return job if job.status.is_terminal else None

    final = await poll(ended, timeout_s=20)
    # Requeued (never started: not an attempt), then run by a new shepherd, once.
    assert (final.status, final.error_reason, final.attempts, final.history) == (JobStatus.SUCCEEDED, None, 1, ())
    assert await sup.read_log(row.job_id) == b"bye\n"
