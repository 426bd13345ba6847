"""INV-RESUBMIT-IS-ATOMIC on SQLite: an attempt's outcome, its history entry, the row's return to the queue and the
event that says so are one transaction. A write that fails part way (here: the event's insert) leaves the row as it
was, still running, with nothing of the attempt recorded; the same end then succeeds once the fault is gone."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from registry_helpers import WallClock, one_running

from supervisor.domain import JobStatus, RegistryError
from supervisor.registry import Ending, Outcome, Retry, SqliteRegistry

KILLED = Outcome(JobStatus.FAILED, "killed_by_SIGKILL")


async def test_a_resubmission_that_fails_part_way_changes_nothing_INV_RESUBMIT_IS_ATOMIC(
    path: Path, clock: WallClock
) -> None:
    reg = await SqliteRegistry.open(path, clock=clock, boot_id="boot-test", outbox=True)
    try:
        job = await one_running(reg)
        ending = Ending(KILLED, exit_code=-9, retry=Retry(clock.now + timedelta(seconds=60), "killed_by_SIGKILL"))
        with sqlite3.connect(path) as conn:  # the fault: the event's insert fails, after the row's update ran
            conn.execute(
                "CREATE TRIGGER fault BEFORE INSERT ON outbox BEGIN SELECT RAISE(ABORT, 'disk trouble'); END"
            )
        with pytest.raises(RegistryError):
            await reg.finalize(job.job_id, ending)
        row = await reg.get(job.job_id)
        assert (row.status, row.attempts, row.history, row.identity) == (JobStatus.RUNNING, 1, (), job.identity)
        assert not [e for e in await reg.outbox_pending(10) if (e.reason or "").startswith("resubmitted")]

        with sqlite3.connect(path) as conn:
            conn.execute("DROP TRIGGER fault")
        change = await reg.finalize(job.job_id, ending)
        assert (change.job.status, len(change.job.history)) == (JobStatus.QUEUED, 1)
        reasons = [e.reason for e in await reg.outbox_pending(10)]
        assert reasons.count("resubmitted: killed_by_SIGKILL") == 1
    finally:
        await reg.aclose()
