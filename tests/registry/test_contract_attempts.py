"""The contract for crash-only recovery (ADR-150 D4, ADR 0009), on every backend: a resubmitted job keeps its id and
goes back to the queue in the same step as the attempt's outcome; it waits out its backoff; a start that never
happened goes back to the head of the queue and does not count."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from registry_helpers import WallClock, enqueue, new_job, one_running, request

from supervisor.domain import JobStatus, Unauthorized
from supervisor.registry import (
    Ending,
    Expect,
    IdentityClaim,
    IdentityRecord,
    NewJob,
    Outcome,
    Registry,
    Retry,
)

KILLED = Outcome(JobStatus.FAILED, "killed_by_SIGKILL")
CANCELLED = Outcome(JobStatus.CANCELLED, "cancelled")
PROCESS = IdentityRecord("process", {"pid": 7, "pid_start_time": 70, "kernel_boot_id": "k"})


def resubmit(clock: WallClock, after_s: float, why: str = "killed_by_SIGKILL") -> Ending:
    return Ending(
        KILLED,
        if_cancel_requested=CANCELLED,
        exit_code=-9,
        retry=Retry(clock.now + timedelta(seconds=after_s), why),
    )


async def test_a_resubmitted_job_keeps_its_id_and_is_queued_with_the_attempt_in_its_history(
    registry: Registry, clock: WallClock
) -> None:
    job = await one_running(registry, "tok")
    [job] = await registry.record_identities([IdentityClaim(job.job_id, PROCESS)])
    started = job.started_at
    clock.advance(30)
    change = await registry.finalize(job.job_id, resubmit(clock, 60))
    after = change.job
    assert change.changed and change.previous is JobStatus.RUNNING
    assert (after.job_id, after.status, after.attempts) == (job.job_id, JobStatus.QUEUED, 1)  # attempts: its starts
    assert after.next_attempt_at == clock.now + timedelta(seconds=60)
    [attempt] = after.history
    assert (attempt.attempt, attempt.started_at, attempt.ended_at) == (1, started, clock.now)
    assert (attempt.status, attempt.reason, attempt.exit_code) == (JobStatus.FAILED, "killed_by_SIGKILL", -9)
    # Back in the queue, it holds nothing of the attempt: no process, no token, no progress, no final outcome.
    assert (after.identity, after.boot_id, after.started_at, after.ended_at) == (None, None, None, None)
    assert (after.error_reason, after.exit_code, after.completed_units) == (None, None, 0)
    assert after == await registry.get(job.job_id)
    try:
        await registry.check_job_token(job.job_id, "tok")
    except Unauthorized:
        pass
    else:
        raise AssertionError("the attempt's token still works")
    events = await registry.outbox_pending(100)
    last = events[-1]
    resubmitted = ("job.transition", "running", "resubmitted: killed_by_SIGKILL")
    assert (last.event, last.previous_status, last.reason) == resubmitted
    assert last.job["status"] == "queued" and last.job["history"][0]["reason"] == "killed_by_SIGKILL"


async def test_a_resubmitted_job_waits_out_its_backoff_and_then_runs_again_in_its_place(
    registry: Registry, clock: WallClock, tmp_path: Path
) -> None:
    job = await one_running(registry)
    await registry.finalize(job.job_id, resubmit(clock, 60))
    later = await enqueue(registry, 1)
    # Not before its backoff: the younger job runs, and the promotion says when the waiting one may.
    promotion = await registry.promote(request(2, "a", "b"))
    assert [j.job_id for j in promotion.jobs] == later
    assert promotion.next_at == clock.now + timedelta(seconds=60)
    clock.advance(59.999)
    assert (await registry.promote(request(2, "c"))).jobs == ()
    clock.advance(0.001)
    promotion = await registry.promote(request(2, "c", log_dir=tmp_path))
    [again] = promotion.jobs
    assert (again.job_id, again.attempts, again.next_attempt_at) == (job.job_id, 2, None)
    assert again.log_path == str(tmp_path / f"{job.job_id}.2.log")  # each attempt's own log
    assert promotion.next_at is None
    assert len(again.history) == 1


async def test_a_promotion_that_fills_every_free_slot_leaves_the_backoff_to_the_next_round(
    registry: Registry, clock: WallClock
) -> None:
    job = await one_running(registry)
    await registry.finalize(job.job_id, resubmit(clock, 60))
    [ready] = await enqueue(registry, 1)
    # The one slot is taken by the ready row: the backoff's end matters only once an end frees the slot again.
    promotion = await registry.promote(request(1, "a"))
    assert ([j.job_id for j in promotion.jobs], promotion.next_at) == ([ready], None)
    await registry.finalize(ready, resubmit(clock, 120))  # its slot free, both rows waiting out a backoff
    promotion = await registry.promote(request(1, "b"))
    assert (promotion.jobs, promotion.next_at) == ((), clock.now + timedelta(seconds=60))


async def test_a_resubmitted_job_keeps_its_place_among_the_jobs_that_may_run(
    registry: Registry, clock: WallClock
) -> None:
    job = await one_running(registry)
    await registry.finalize(job.job_id, resubmit(clock, 0.5))
    younger = await enqueue(registry, 2)
    clock.advance(1)
    promotion = await registry.promote(request(1))
    assert [j.job_id for j in promotion.jobs] == [job.job_id]  # it was enqueued before them
    assert (await registry.get(younger[0])).queue_position == 1


async def test_a_cancel_that_reached_the_row_first_ends_it_instead_of_a_resubmission(
    registry: Registry, clock: WallClock
) -> None:
    job = await one_running(registry)
    await registry.request_cancel(job.job_id)
    change = await registry.finalize(job.job_id, resubmit(clock, 60))
    assert (change.job.status, change.job.error_reason, change.job.history) == (
        JobStatus.CANCELLED,
        "cancelled",
        (),
    )


async def test_a_job_waiting_out_its_backoff_is_cancelled_at_once(registry: Registry, clock: WallClock) -> None:
    job = await one_running(registry)
    await registry.finalize(job.job_id, resubmit(clock, 3600))
    change = await registry.request_cancel(job.job_id)
    assert change.changed
    assert (change.job.status, change.job.error_reason) == (JobStatus.CANCELLED, "cancelled")
    assert len(change.job.history) == 1  # its earlier attempt stays on record
    assert (await registry.promote(request(1))).next_at is None


async def test_a_start_that_never_happened_goes_back_to_the_head_of_the_queue_uncounted(registry: Registry) -> None:
    [first] = await enqueue(registry, 1)
    [started] = (await registry.promote(request(1))).jobs
    assert (started.job_id, started.attempts) == (first, 1)
    younger = await enqueue(registry, 2)
    change = await registry.requeue(first, expect=Expect(None), reason="never_started")
    assert change.changed and change.previous is JobStatus.RUNNING
    assert (change.job.status, change.job.attempts, change.job.history) == (JobStatus.QUEUED, 0, ())
    assert change.job.queue_position == 1  # the head: every job still queued came after it
    [again] = (await registry.promote(request(1))).jobs
    assert (again.job_id, again.attempts) == (first, 1)
    assert (await registry.get(younger[0])).status is JobStatus.QUEUED
    last = (await registry.outbox_pending(100))[-2]  # the requeue, before the promotion that followed it
    assert (last.event, last.previous_status, last.reason) == ("job.transition", "running", "never_started")


async def test_a_requeue_of_a_row_whose_cancel_was_requested_ends_it_cancelled_never_queued(registry: Registry) -> None:
    """A cancel asked while the start was under way is never dropped by the requeue that undoes the start: the row
    ends cancelled_before_start, the start not counted, and its slot is free."""
    [first, second] = await enqueue(registry, 2)
    assert [job.job_id for job in (await registry.promote(request(1))).jobs] == [first]
    assert (await registry.request_cancel(first, "op")).job.cancel_requested
    change = await registry.requeue(first, expect=Expect(None), reason="pause_file_appeared")
    assert change.changed and change.previous is JobStatus.RUNNING
    ended = change.job
    assert (ended.status, ended.error_reason, ended.attempts, ended.cancelled_by) == (
        JobStatus.CANCELLED,
        "cancelled_before_start",
        0,
        "op",
    )
    assert ended.ended_at is not None and ended.history == ()
    [behind] = (await registry.promote(request(1))).jobs
    assert behind.job_id == second  # its slot was freed
    last = (await registry.outbox_pending(100))[-2]
    assert (last.event, last.previous_status, last.reason) == ("job.transition", "running", "cancelled_before_start")


async def test_a_requeue_is_only_of_the_running_row_the_evidence_was_about(registry: Registry) -> None:
    job = await one_running(registry)
    [job] = await registry.record_identities([IdentityClaim(job.job_id, PROCESS)])
    unchanged = await registry.requeue(job.job_id, expect=Expect(None), reason="never_started")
    assert not unchanged.changed and unchanged.job.status is JobStatus.RUNNING  # it has an identity now
    await registry.finalize(job.job_id, Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0))
    ended = await registry.requeue(job.job_id, expect=Expect(PROCESS), reason="never_started")
    assert not ended.changed and ended.job.status is JobStatus.SUCCEEDED


async def test_a_job_records_the_starts_its_kind_allows(registry: Registry) -> None:
    result = await registry.enqueue(NewJob("k", {}, ["x"], max_attempts=3))
    assert result.job.max_attempts == 3
    [plain] = await registry.enqueue_many([new_job(1)])
    assert plain.job.max_attempts == 1
