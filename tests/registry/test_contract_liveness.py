"""The registry contract: what a running job says (heartbeats: INV-PROGRESS-NOT-LIVENESS, tokens, batches) and what
the sweeper judges (set_absence), on every backend."""

from __future__ import annotations

import pytest
from registry_helpers import WallClock, enqueue, one_running, running

from supervisor.domain import Job, JobNotFound, JobStatus, RequestError, Unauthorized
from supervisor.registry import Beat, Change, Ending, Outcome, Registry

SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)


def outcome(result: Job | RequestError) -> str:
    return type(result).__name__


# -- heartbeats -------------------------------------------------------------------------------------------


async def test_every_beat_is_liveness_only_a_higher_count_is_progress_INV_PROGRESS_NOT_LIVENESS(
    registry: Registry, clock: WallClock
) -> None:
    job = await one_running(registry, "secret")
    assert (job.last_heartbeat_at, job.last_progress_at, job.completed_units) == (None, None, 0)
    first_at = clock.advance(10)
    [beat] = await registry.record_heartbeats([Beat(job.job_id, "secret", 2, total_units=5, stage="episodes")])
    assert isinstance(beat, Job)
    assert (beat.completed_units, beat.total_units, beat.stage) == (2, 5, "episodes")
    assert beat.last_heartbeat_at == beat.last_progress_at == first_at

    second_at = clock.advance(10)
    [beat] = await registry.record_heartbeats([Beat(job.job_id, "secret", 1)])  # a lower count never lowers it
    assert isinstance(beat, Job)
    assert (beat.completed_units, beat.total_units, beat.stage) == (2, 5, "episodes")  # None keeps what was said
    assert (beat.last_heartbeat_at, beat.last_progress_at) == (second_at, first_at)

    third_at = clock.advance(10)
    [beat] = await registry.record_heartbeats([Beat(job.job_id, "secret", 2, stage="upload")])  # the same count
    assert isinstance(beat, Job)
    assert (beat.last_heartbeat_at, beat.last_progress_at, beat.stage) == (third_at, first_at, "upload")

    fourth_at = clock.advance(10)
    [beat] = await registry.record_heartbeats([Beat(job.job_id, "secret", 3, total_units=6)])
    assert isinstance(beat, Job)
    assert (beat.completed_units, beat.total_units) == (3, 6)
    assert beat.last_heartbeat_at == beat.last_progress_at == fourth_at
    assert await registry.get(job.job_id) == beat  # the answer is the row as stored


async def test_a_batch_records_the_good_beats_whatever_the_refused_ones(registry: Registry, clock: WallClock) -> None:
    a, b, c = await running(registry, ["a", "b", "c"])
    ended = await registry.finalize(c.job_id, SUCCEEDED)
    clock.advance(5)
    results = await registry.record_heartbeats(
        [
            Beat(a.job_id, "a", 5, total_units=9, stage="one"),
            Beat(b.job_id, "wrong", 7, stage="never"),  # another token
            Beat("no-such-job", "a", 1),  # no such job
            Beat(c.job_id, "c", 1),  # ended: its token is gone
            Beat(b.job_id, "b", 3),
            Beat(a.job_id, "a", 4),  # the same job again, in order: a lower count moves no watermark
        ]
    )
    assert [outcome(r) for r in results] == ["Job", "Unauthorized", "Unauthorized", "Unauthorized", "Job", "Job"]
    first, second = await registry.get(a.job_id), await registry.get(b.job_id)
    assert (first.completed_units, first.total_units, first.stage) == (5, 9, "one")
    assert (first.last_heartbeat_at, first.last_progress_at) == (clock.now, clock.now)
    assert (second.completed_units, second.stage) == (3, None)  # the refused beat's 7 and stage wrote nothing
    assert (results[5], results[4]) == (first, second)  # each answer is the row after its own beat
    assert await registry.get(c.job_id) == ended.job  # a refused beat writes nothing


async def test_a_refused_beat_writes_nothing(registry: Registry, clock: WallClock) -> None:
    job = await one_running(registry, "mine")
    clock.advance(5)
    [refused] = await registry.record_heartbeats([Beat(job.job_id, "theirs", 10, total_units=10, stage="x")])
    assert isinstance(refused, Unauthorized)
    assert await registry.get(job.job_id) == job


async def test_a_beat_for_a_wrong_token_and_for_an_unknown_job_earn_the_same_answer(registry: Registry) -> None:
    job = await one_running(registry, "mine")
    wrong_token, unknown_job = await registry.record_heartbeats(
        [Beat(job.job_id, "theirs", 1), Beat("no-such-job", "mine", 1)]
    )
    assert isinstance(wrong_token, Unauthorized) and isinstance(unknown_job, Unauthorized)
    assert (str(wrong_token), wrong_token.field) == (str(unknown_job), unknown_job.field)


async def test_a_row_that_is_not_running_refuses_beats(registry: Registry) -> None:
    """Queued: no token yet; ended: its token gone. Either way the beat is refused and writes nothing (as
    ``Unauthorized``: a row holds a token hash only while it runs, so no beat gets as far as ``Conflict``)."""
    [queued] = await enqueue(registry, 1)
    job = await one_running(registry, "mine")
    ended = await registry.finalize(job.job_id, SUCCEEDED)
    before = await registry.get(queued)
    results = await registry.record_heartbeats([Beat(queued, "mine", 1), Beat(job.job_id, "mine", 1)])
    assert [outcome(r) for r in results] == ["Unauthorized", "Unauthorized"]
    assert (await registry.get(queued), await registry.get(job.job_id)) == (before, ended.job)


async def test_an_empty_batch_answers_nothing(registry: Registry) -> None:
    assert await registry.record_heartbeats([]) == []


# -- set_absence --------------------------------------------------------------------------------------------


async def test_stalled_since_is_set_when_stalled_turns_on_and_kept_while_on(
    registry: Registry, clock: WallClock
) -> None:
    job = await one_running(registry)
    stalled_at = clock.advance(60)
    change = await registry.set_absence(job.job_id, stalled=True, silent=False)
    assert (change.changed, change.previous) == (True, None)
    assert (change.job.stalled, change.job.stalled_since, change.job.silent) == (True, stalled_at, False)
    assert change.job.status is JobStatus.RUNNING
    assert await registry.get(job.job_id) == change.job

    clock.advance(60)
    change = await registry.set_absence(job.job_id, stalled=True, silent=True)  # still stalled, now silent too
    assert change.changed
    assert (change.job.stalled, change.job.stalled_since, change.job.silent) == (True, stalled_at, True)

    clock.advance(60)
    change = await registry.set_absence(job.job_id, stalled=False, silent=True)
    assert (change.job.stalled, change.job.stalled_since, change.job.silent) == (False, None, True)

    again_at = clock.advance(60)
    change = await registry.set_absence(job.job_id, stalled=True, silent=False)  # a new stall: a new start
    assert (change.job.stalled, change.job.stalled_since, change.job.silent) == (True, again_at, False)
    assert await registry.get(job.job_id) == change.job


async def test_a_judgement_that_changes_nothing_writes_nothing(registry: Registry, clock: WallClock) -> None:
    job = await one_running(registry)
    assert await registry.set_absence(job.job_id, stalled=False, silent=False, events=[("job.x", "y")]) == Change(
        job, changed=False
    )
    flagged = (await registry.set_absence(job.job_id, stalled=True, silent=True)).job
    depth = await registry.outbox_depth()
    clock.advance(30)
    again = await registry.set_absence(job.job_id, stalled=True, silent=True, events=[("job.stalled", "again")])
    assert again == Change(flagged, changed=False)
    assert await registry.get(job.job_id) == flagged
    assert await registry.outbox_depth() == depth


async def test_set_absence_leaves_a_row_that_does_not_run_alone(registry: Registry) -> None:
    [queued] = await enqueue(registry, 1)
    job = await one_running(registry)
    ended = await registry.finalize(job.job_id, SUCCEEDED)
    depth = await registry.outbox_depth()
    for job_id, row in ((queued, await registry.get(queued)), (job.job_id, ended.job)):
        change = await registry.set_absence(job_id, stalled=True, silent=True, events=[("job.stalled", "x")])
        assert change == Change(row, changed=False)
        assert await registry.get(job_id) == row
    assert await registry.outbox_depth() == depth


async def test_set_absence_on_an_unknown_job_is_not_found(registry: Registry) -> None:
    with pytest.raises(JobNotFound):
        await registry.set_absence("no-such-job", stalled=True, silent=False)


async def test_absence_flags_survive_beats_and_the_end(registry: Registry) -> None:
    """Only the sweeper's judgement moves them (INV-STALE-SET-BY-SUPERVISOR): a beat does not clear them, and the
    ended row keeps the last judgement made while it ran."""
    job = await one_running(registry, "t")
    flagged = (await registry.set_absence(job.job_id, stalled=True, silent=True)).job
    [beat] = await registry.record_heartbeats([Beat(job.job_id, "t", 5)])
    assert isinstance(beat, Job)
    assert (beat.stalled, beat.stalled_since, beat.silent) == (True, flagged.stalled_since, True)
    ended = await registry.finalize(job.job_id, SUCCEEDED)
    assert (ended.job.stalled, ended.job.stalled_since, ended.job.silent) == (True, flagged.stalled_since, True)


# -- record_event -------------------------------------------------------------------------------------------


async def test_record_event_answers_the_row_and_changes_it_not(registry: Registry) -> None:
    job = await one_running(registry)
    row = await registry.record_event(job.job_id, "job.adopted", "adopted_after_restart")
    assert row == job == await registry.get(job.job_id)
    with pytest.raises(JobNotFound):
        await registry.record_event("no-such-job", "job.adopted", None)


async def test_record_event_writes_nothing_after_a_rows_end(registry: Registry) -> None:
    job = await one_running(registry)
    ended = (await registry.finalize(job.job_id, Ending(Outcome(JobStatus.SUCCEEDED)))).job
    depth = await registry.outbox_depth()
    assert await registry.record_event(job.job_id, "job.adopted", "adopted") == ended
    assert await registry.outbox_depth() == depth  # its end stays its last event
