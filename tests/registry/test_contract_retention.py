"""The registry contract: an operator's retry names the job it retries (``retry_of``, ``retries_of``), and finished
history is pruned by age and by count (``prune_jobs``), oldest first, in bounded batches, never a queued or running
row and never a row whose events are still in the outbox, on every backend."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from registry_helpers import WallClock, enqueue, new_job, one_running, request

from supervisor.domain import JobNotFound, JobStatus, PageRequest
from supervisor.registry import Ending, NewJob, Outcome, Registry

SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)
FAILED = Ending(Outcome(JobStatus.FAILED, "exit_code_1"), exit_code=1)


async def deliver_all(reg: Registry) -> None:
    """Every event in the outbox delivered (what the webhook sender does)."""
    while pending := await reg.outbox_pending(1000):
        await reg.outbox_delete([event.seq for event in pending])


async def finished(reg: Registry, clock: WallClock, n: int, *, ending: Ending = SUCCEEDED) -> list[str]:
    """``n`` rows that ran and ended, a minute apart (clock moved before each end); their ids, oldest first."""
    ids = []
    for i in range(n):
        job = await one_running(reg, f"t{i}")
        clock.advance(60)
        await reg.finalize(job.job_id, ending)
        ids.append(job.job_id)
    return ids


# -- retry_of and retries_of ---------------------------------------------------------------------------


async def test_a_retry_names_the_job_it_retries_and_the_old_job_lists_its_retries(registry: Registry) -> None:
    [old] = await finished(registry, WallClock(), 1, ending=FAILED)
    assert (await registry.get(old)).retry_of is None
    retry = NewJob("k", {"n": 1000}, ["run", "1000"], retry_of=old)
    first = await registry.enqueue(retry)
    second = await registry.enqueue(retry)
    assert first.job.retry_of == old and first.job.status is JobStatus.QUEUED
    assert (await registry.get(first.job.job_id)).retry_of == old
    page, _ = await registry.list_jobs(PageRequest.parse(limit=10))
    assert {job.job_id: job.retry_of for job in page}[second.job.job_id] == old
    assert await registry.retries_of(old) == [first.job.job_id, second.job.job_id]  # oldest first
    assert await registry.retries_of(first.job.job_id) == []
    assert await registry.retries_of("no-such-job") == []


async def test_a_retry_in_a_batch_keeps_its_link(registry: Registry) -> None:
    [old] = await enqueue(registry, 1)
    [result] = await registry.enqueue_many([NewJob("k", {}, ["run"], retry_of=old)])
    assert result.job.retry_of == old
    assert await registry.retries_of(old) == [result.job.job_id]


# -- prune_jobs ------------------------------------------------------------------------------------------


async def test_prune_by_age_removes_the_rows_that_ended_before_the_cutoff_oldest_first(
    registry: Registry, clock: WallClock
) -> None:
    ids = await finished(registry, clock, 4)
    cutoff = (await registry.get(ids[2])).ended_at
    assert cutoff is not None
    queued = await enqueue(registry, 1)
    live = await one_running(registry, "live")
    await deliver_all(registry)
    gone = await registry.prune_jobs(ended_before=cutoff, keep_latest=None, limit=100)
    assert [job.job_id for job in gone] == ids[:2]  # one that ended exactly at the cutoff is kept
    assert [job.status for job in gone] == [JobStatus.SUCCEEDED] * 2
    for job_id in ids[:2]:
        with pytest.raises(JobNotFound):
            await registry.get(job_id)
    for job_id in (ids[2], ids[3], queued[0], live.job_id):
        await registry.get(job_id)
    assert (await registry.counts())["succeeded"] == 2


async def test_prune_never_removes_a_queued_or_running_row(registry: Registry, clock: WallClock) -> None:
    live = await one_running(registry, "live")
    queued = await enqueue(registry, 2)
    await deliver_all(registry)
    clock.advance(86400)
    assert await registry.prune_jobs(ended_before=clock.now, keep_latest=0, limit=100) == []
    assert [(await registry.get(job_id)).status for job_id in (*queued, live.job_id)] == [
        JobStatus.QUEUED,
        JobStatus.QUEUED,
        JobStatus.RUNNING,
    ]


async def test_prune_by_count_keeps_the_newest_finished_rows(registry: Registry, clock: WallClock) -> None:
    ids = await finished(registry, clock, 5)
    await enqueue(registry, 3)  # queued rows are not counted
    await deliver_all(registry)
    gone = await registry.prune_jobs(ended_before=None, keep_latest=2, limit=100)
    assert [job.job_id for job in gone] == ids[:3]
    assert [(await registry.get(job_id)).job_id for job_id in ids[3:]] == ids[3:]
    assert await registry.prune_jobs(ended_before=None, keep_latest=2, limit=100) == []
    everything = await registry.prune_jobs(ended_before=None, keep_latest=0, limit=100)
    assert [job.job_id for job in everything] == ids[3:]


async def test_either_rule_removes_a_row(registry: Registry, clock: WallClock) -> None:
    ids = await finished(registry, clock, 4)
    await deliver_all(registry)
    old = (await registry.get(ids[1])).ended_at
    assert old is not None
    # By age: the first; by count (keep 2): the first two. Together: the first two, once each.
    gone = await registry.prune_jobs(ended_before=old, keep_latest=2, limit=100)
    assert [job.job_id for job in gone] == ids[:2]


async def test_prune_takes_at_most_limit_rows_a_call_and_the_next_call_goes_on(
    registry: Registry, clock: WallClock
) -> None:
    ids = await finished(registry, clock, 5)
    await deliver_all(registry)
    now = clock.advance(1)
    assert [j.job_id for j in await registry.prune_jobs(ended_before=now, keep_latest=None, limit=2)] == ids[:2]
    assert [j.job_id for j in await registry.prune_jobs(ended_before=now, keep_latest=None, limit=2)] == ids[2:4]
    assert [j.job_id for j in await registry.prune_jobs(ended_before=now, keep_latest=None, limit=2)] == ids[4:]
    assert await registry.prune_jobs(ended_before=now, keep_latest=None, limit=2) == []


async def test_a_dry_run_says_what_would_go_and_removes_nothing(registry: Registry, clock: WallClock) -> None:
    ids = await finished(registry, clock, 3)
    await deliver_all(registry)
    now = clock.advance(1)
    would = await registry.prune_jobs(ended_before=now, keep_latest=None, limit=100, dry_run=True)
    assert [job.job_id for job in would] == ids
    assert (await registry.counts())["succeeded"] == 3
    assert await registry.prune_jobs(ended_before=now, keep_latest=None, limit=100) == would


async def test_a_row_with_an_undelivered_event_is_kept_until_it_is_delivered(
    registry: Registry, clock: WallClock
) -> None:
    ids = await finished(registry, clock, 3)
    pending = await registry.outbox_pending(100)
    await registry.outbox_delete([event.seq for event in pending if event.job_id != ids[1]])  # ids[1]'s: not yet
    now = clock.advance(1)
    assert [j.job_id for j in await registry.prune_jobs(ended_before=now, keep_latest=None, limit=100)] == [
        ids[0],
        ids[2],
    ]
    events = await registry.outbox_pending(10)
    assert events and {event.job_id for event in events} == {ids[1]}  # its events are whole, and so is its row
    assert (await registry.get(ids[1])).job_id == ids[1]
    await deliver_all(registry)
    assert [j.job_id for j in await registry.prune_jobs(ended_before=now, keep_latest=None, limit=100)] == [ids[1]]


async def test_a_registry_without_an_outbox_prunes_at_once(open_registry: Any, clock: WallClock) -> None:
    reg = await open_registry(outbox=False)
    ids = await finished(reg, clock, 2)
    gone = await reg.prune_jobs(ended_before=None, keep_latest=1, limit=10)
    assert [job.job_id for job in gone] == ids[:1]


async def test_a_pruned_row_says_where_its_logs_are(registry: Registry, clock: WallClock, tmp_path: Path) -> None:
    await registry.enqueue(new_job(1))
    [job] = (await registry.promote(request(1, log_dir=tmp_path))).jobs
    clock.advance(5)
    await registry.finalize(job.job_id, FAILED)
    await deliver_all(registry)
    [gone] = await registry.prune_jobs(ended_before=clock.advance(1), keep_latest=None, limit=1)
    assert (gone.job_id, gone.kind, gone.status, gone.attempts) == (job.job_id, "k", JobStatus.FAILED, 1)
    assert gone.log_path == str(tmp_path / f"{job.job_id}.log")
    assert gone.ended_at == clock.now - timedelta(seconds=1)


async def test_a_job_cancelled_before_it_started_is_pruned_with_no_log(registry: Registry, clock: WallClock) -> None:
    [job_id] = await enqueue(registry, 1)
    await registry.request_cancel(job_id)
    await deliver_all(registry)
    [gone] = await registry.prune_jobs(ended_before=clock.advance(1), keep_latest=None, limit=1)
    assert (gone.job_id, gone.status, gone.log_path, gone.attempts) == (job_id, JobStatus.CANCELLED, None, 0)


async def test_a_prune_with_no_rule_removes_nothing_and_bad_bounds_are_refused(
    registry: Registry, clock: WallClock
) -> None:
    await finished(registry, clock, 2)
    await deliver_all(registry)
    assert await registry.prune_jobs(ended_before=None, keep_latest=None, limit=10) == []
    with pytest.raises(ValueError, match="limit"):
        await registry.prune_jobs(ended_before=clock.now, keep_latest=None, limit=0)
    with pytest.raises(ValueError, match="keep_latest"):
        await registry.prune_jobs(ended_before=None, keep_latest=-1, limit=10)
    assert (await registry.counts())["succeeded"] == 2


async def test_the_retries_of_a_pruned_job_still_name_it(registry: Registry, clock: WallClock) -> None:
    [old] = await finished(registry, clock, 1, ending=FAILED)
    retry = await registry.enqueue(NewJob("k", {}, ["run"], retry_of=old))
    await deliver_all(registry)
    assert [j.job_id for j in await registry.prune_jobs(ended_before=clock.advance(1), keep_latest=None, limit=9)] == [
        old
    ]
    assert (await registry.get(retry.job.job_id)).retry_of == old
