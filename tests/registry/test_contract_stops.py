"""The registry contract: a stop the supervisor begins (a kind's deadline, a stall under ``terminate``) is recorded on
the row before any signal (``request_stop``), and the row then ends as that stop planned (``Ending.if_stopped``),
whichever boot records the end and whatever the exit says -- as a cancel request is, on every backend
(INV-STOP-REASON-BEFORE-SIGNAL, docs/reliability.md § A stop's reason outlives its boot)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from registry_helpers import WallClock, enqueue, one_running

from supervisor.domain import Job, JobStatus
from supervisor.registry import (
    Ending,
    Expect,
    IdentityClaim,
    IdentityRecord,
    Outcome,
    Registry,
    Retry,
)

PROCESS = IdentityRecord("process", {"pid": 4242, "pid_start_time": 7, "kernel_boot_id": "kb"})
OTHER = IdentityRecord("process", {"pid": 4243, "pid_start_time": 9, "kernel_boot_id": "kb"})
CANCELLED = Outcome(JobStatus.CANCELLED, "cancelled")


def exited_143(clock: WallClock) -> Ending:
    """What a monitor decides for a job that exited 143, a code its kind retries (attempts remain), with the end of
    each stop the row may record, as ``core.ending`` gives it."""
    retry = Retry(clock.now + timedelta(seconds=60), "exit_code_143")
    stall_retry = Retry(clock.now + timedelta(seconds=60), "progress_stalled")
    return Ending(
        Outcome(JobStatus.FAILED, "exit_code_143"),
        if_cancel_requested=CANCELLED,
        exit_code=143,
        retry=retry,
        if_stopped={
            "deadline": Ending(
                Outcome(JobStatus.FAILED, "deadline_exceeded"), if_cancel_requested=CANCELLED, exit_code=143
            ),
            "stall": Ending(
                Outcome(JobStatus.STALE, "progress_stalled"),
                if_cancel_requested=CANCELLED,
                exit_code=143,
                retry=stall_retry,
            ),
        },
    )


async def started(registry: Registry) -> Job:
    job = await one_running(registry)
    [job] = await registry.record_identities([IdentityClaim(job.job_id, PROCESS)])
    return job


async def test_INV_STOP_REASON_BEFORE_SIGNAL_a_recorded_deadline_stop_ends_failed_never_resubmitted(
    registry: Registry, clock: WallClock
) -> None:
    job = await started(registry)
    recorded = await registry.request_stop(job.job_id, "deadline", expect=Expect(PROCESS))
    assert recorded.changed and recorded.previous is None  # a running row stays running: only its reason is new
    assert (recorded.job.status, recorded.job.stop_reason) == (JobStatus.RUNNING, "deadline")
    assert await registry.get(job.job_id) == recorded.job
    clock.advance(5)
    # The end is recorded by a boot that knows nothing of the stop (the one that began it died in the grace).
    ended = (await registry.finalize(job.job_id, exited_143(clock), expect=Expect(PROCESS))).job
    assert (ended.status, ended.error_reason, ended.exit_code) == (JobStatus.FAILED, "deadline_exceeded", 143)
    assert (ended.attempts, ended.history, ended.stop_reason) == (1, (), "deadline")


async def test_without_a_recorded_stop_the_same_ending_resubmits(registry: Registry, clock: WallClock) -> None:
    job = await started(registry)
    after = (await registry.finalize(job.job_id, exited_143(clock))).job
    assert (after.status, after.stop_reason) == (JobStatus.QUEUED, None)
    assert [a.reason for a in after.history] == ["exit_code_143"]


async def test_INV_STOP_REASON_BEFORE_SIGNAL_a_recorded_stall_stop_ends_as_a_stall_and_its_next_attempt_has_none(
    registry: Registry, clock: WallClock
) -> None:
    job = await started(registry)
    await registry.request_stop(job.job_id, "stall", expect=Expect(PROCESS))
    after = (await registry.finalize(job.job_id, exited_143(clock))).job
    # A stall stop is resubmitted (its rule), its attempt recorded as the stall it was, not as exit_code_143.
    assert after.status is JobStatus.QUEUED
    assert [(a.status, a.reason, a.exit_code) for a in after.history] == [(JobStatus.STALE, "progress_stalled", 143)]
    assert after.stop_reason is None  # the stop was the attempt's: the next one begins with none


async def test_the_first_stop_reason_stands(registry: Registry) -> None:
    job = await started(registry)
    await registry.request_stop(job.job_id, "stall", expect=Expect(PROCESS))
    again = await registry.request_stop(job.job_id, "deadline", expect=Expect(PROCESS))
    assert (again.changed, again.job.stop_reason) == (False, "stall")
    assert (await registry.get(job.job_id)).stop_reason == "stall"


async def test_a_stop_is_recorded_only_on_the_running_attempt_it_names(registry: Registry) -> None:
    job = await started(registry)
    other = await registry.request_stop(job.job_id, "deadline", expect=Expect(OTHER))
    assert (other.changed, other.job.stop_reason) == (False, None)
    [queued] = await enqueue(registry, 1, start=7)
    assert not (await registry.request_stop(queued, "deadline", expect=Expect(None))).changed
    await registry.finalize(job.job_id, Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0))
    ended = await registry.request_stop(job.job_id, "deadline", expect=Expect(PROCESS))
    assert (ended.changed, ended.job.status, ended.job.stop_reason) == (False, JobStatus.SUCCEEDED, None)
    assert (await registry.get(queued)).stop_reason is None


async def test_a_cancel_on_the_row_wins_over_a_recorded_stop(registry: Registry, clock: WallClock) -> None:
    job = await started(registry)
    await registry.request_stop(job.job_id, "deadline", expect=Expect(PROCESS))
    await registry.request_cancel(job.job_id, "operator")
    ended = (await registry.finalize(job.job_id, exited_143(clock))).job
    assert (ended.status, ended.error_reason, ended.attempts) == (JobStatus.CANCELLED, "cancelled", 1)


@pytest.mark.parametrize("why", ["deadline", "stall"])
async def test_an_ending_that_names_no_end_for_the_stop_is_recorded_as_it_is(registry: Registry, why: str) -> None:
    """A spawn failure, an operator's stale mark: decided without a process's exit, they stand as they are."""
    job = await started(registry)
    await registry.request_stop(job.job_id, why, expect=Expect(PROCESS))
    ended = (await registry.finalize(job.job_id, Ending(Outcome(JobStatus.STALE, "wall_clock_stale")))).job
    assert (ended.status, ended.error_reason) == (JobStatus.STALE, "wall_clock_stale")
