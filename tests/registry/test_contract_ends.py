"""The registry contract: how a row ends (finalize with an ``Ending``, its ``Expect`` guard, the slot it frees for
the next promotion, illegal transitions), cancel requests, and the job token that ends with the row, on every
backend."""

from __future__ import annotations

import dataclasses

import pytest
from registry_helpers import WallClock, enqueue, one_running, request, running

from supervisor.domain import IllegalTransition, JobNotFound, JobStatus, PageRequest, Unauthorized
from supervisor.registry import (
    Change,
    Ending,
    Expect,
    IdentityClaim,
    IdentityRecord,
    NewJob,
    Outcome,
    Registry,
)

EXITED_3 = Ending(Outcome(JobStatus.FAILED, "exit_code_3"), exit_code=3)
SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)
# What a monitor decides for a job killed by SIGTERM: failed, unless a cancel was asked for.
KILLED = Ending(
    Outcome(JobStatus.FAILED, "killed_by_signal_15"),
    if_cancel_requested=Outcome(JobStatus.CANCELLED, "cancelled"),
    exit_code=-15,
)

PROCESS = IdentityRecord("process", {"pid": 4242, "pid_start_time": 7, "kernel_boot_id": "kb"})


# -- finalize -----------------------------------------------------------------------------------------------


async def test_finalize_ends_a_running_row_as_the_ending_says(registry: Registry, clock: WallClock) -> None:
    job = await one_running(registry)
    clock.advance(30)
    change = await registry.finalize(job.job_id, EXITED_3)
    assert (change.changed, change.previous) == (True, JobStatus.RUNNING)
    ended = change.job
    assert (ended.status, ended.error_reason, ended.exit_code) == (JobStatus.FAILED, "exit_code_3", 3)
    assert (ended.ended_at, ended.started_at) == (clock.now, job.started_at)
    assert ended.token_hash is None  # the token ends with the job
    assert await registry.get(job.job_id) == ended


async def test_a_success_records_no_reason(registry: Registry) -> None:
    job = await one_running(registry)
    change = await registry.finalize(job.job_id, SUCCEEDED)
    assert (change.job.status, change.job.error_reason, change.job.exit_code) == (JobStatus.SUCCEEDED, None, 0)


async def test_the_outcome_is_recorded_when_no_cancel_was_requested(registry: Registry) -> None:
    job = await one_running(registry)
    change = await registry.finalize(job.job_id, KILLED)
    assert (change.job.status, change.job.error_reason, change.job.exit_code) == (
        JobStatus.FAILED,
        "killed_by_signal_15",
        -15,
    )


async def test_a_cancel_requested_before_the_write_chooses_if_cancel_requested(registry: Registry) -> None:
    job = await one_running(registry)
    await registry.request_cancel(job.job_id)
    change = await registry.finalize(job.job_id, KILLED)
    assert (change.job.status, change.job.error_reason, change.job.exit_code) == (
        JobStatus.CANCELLED,
        "cancelled",
        -15,
    )
    assert change.job.cancel_requested


async def test_a_cancel_requested_with_no_alternative_keeps_the_outcome(registry: Registry) -> None:
    job = await one_running(registry)
    await registry.request_cancel(job.job_id)
    change = await registry.finalize(job.job_id, SUCCEEDED)  # it finished before the stop reached it
    assert change.job.status is JobStatus.SUCCEEDED


async def test_a_success_enqueues_its_follow_up_in_the_same_step(registry: Registry) -> None:
    job = await one_running(registry)
    then = NewJob("enrich", {"of": job.job_id}, ["enrich"])
    change = await registry.finalize(job.job_id, dataclasses.replace(SUCCEEDED, then=then))
    assert change.job.status is JobStatus.SUCCEEDED and change.follow_up is not None
    follow_up = change.follow_up.job
    assert (follow_up.kind, follow_up.params, follow_up.status) == ("enrich", {"of": job.job_id}, JobStatus.QUEUED)
    assert (await registry.get(follow_up.job_id)).status is JobStatus.QUEUED
    # Ending the row again (a retry of the same end after a lost answer) changes nothing and enqueues nothing more.
    again = await registry.finalize(job.job_id, dataclasses.replace(SUCCEEDED, then=then))
    assert (again.changed, again.follow_up) == (False, None)
    assert (await registry.counts())["queued"] == 1


@pytest.mark.parametrize("how", ["failed", "cancel chosen"])
async def test_only_a_success_enqueues_a_follow_up(registry: Registry, how: str) -> None:
    job = await one_running(registry)
    then = NewJob("enrich", {}, ["enrich"])
    if how == "cancel chosen":
        await registry.request_cancel(job.job_id)
        ending = dataclasses.replace(SUCCEEDED, if_cancel_requested=Outcome(JobStatus.CANCELLED, "cancelled"))
    else:
        ending = EXITED_3
    change = await registry.finalize(job.job_id, dataclasses.replace(ending, then=then))
    assert change.job.status is not JobStatus.SUCCEEDED and change.follow_up is None
    assert (await registry.counts())["queued"] == 0


async def test_a_terminal_row_is_left_alone(registry: Registry, clock: WallClock) -> None:
    job = await one_running(registry)
    first = await registry.finalize(job.job_id, EXITED_3)
    depth = await registry.outbox_depth()
    clock.advance(10)
    again = await registry.finalize(job.job_id, SUCCEEDED)
    assert again == Change(first.job, changed=False)
    assert await registry.get(job.job_id) == first.job
    assert await registry.outbox_depth() == depth  # nothing changed, nothing to tell


async def test_a_row_cancelled_before_start_is_terminal_too(registry: Registry) -> None:
    [job_id] = await enqueue(registry, 1)
    cancelled = (await registry.request_cancel(job_id)).job
    again = await registry.finalize(job_id, SUCCEEDED)
    assert again == Change(cancelled, changed=False)


async def test_finalizing_a_queued_row_is_an_illegal_transition(registry: Registry) -> None:
    [job_id] = await enqueue(registry, 1)
    before = await registry.get(job_id)
    depth = await registry.outbox_depth()
    with pytest.raises(IllegalTransition) as err:
        await registry.finalize(job_id, SUCCEEDED)
    assert (err.value.job_id, err.value.from_status, err.value.to_status) == (
        job_id,
        JobStatus.QUEUED,
        JobStatus.SUCCEEDED,
    )
    assert await registry.get(job_id) == before
    assert await registry.outbox_depth() == depth


async def test_finalizing_an_unknown_job_is_not_found(registry: Registry) -> None:
    with pytest.raises(JobNotFound):
        await registry.finalize("no-such-job", SUCCEEDED)


# -- the Expect guard ----------------------------------------------------------------------------------------


async def test_an_expect_that_matches_the_recorded_identity_lets_the_end_through(registry: Registry) -> None:
    job = await one_running(registry)
    await registry.record_identities([IdentityClaim(job.job_id, PROCESS)])
    same = IdentityRecord("process", {"kernel_boot_id": "kb", "pid_start_time": 7, "pid": 4242})  # equal as a whole
    change = await registry.finalize(job.job_id, EXITED_3, expect=Expect(same))
    assert change.changed and change.job.status is JobStatus.FAILED


@pytest.mark.parametrize(
    "expected",
    [
        IdentityRecord("process", {"pid": 4242, "pid_start_time": 8, "kernel_boot_id": "kb"}),  # another start
        IdentityRecord("process", {"pid": 4242}),  # a part of it
        IdentityRecord("container", {"pid": 4242, "pid_start_time": 7, "kernel_boot_id": "kb"}),  # another executor
        None,  # evidence about a job that had not spawned
    ],
    ids=["other-start-time", "subset", "other-kind", "none"],
)
async def test_an_expect_that_does_not_match_the_recorded_identity_leaves_the_row_alone(
    registry: Registry, expected: IdentityRecord | None
) -> None:
    job = await one_running(registry)
    [recorded] = await registry.record_identities([IdentityClaim(job.job_id, PROCESS)])
    depth = await registry.outbox_depth()
    change = await registry.finalize(job.job_id, EXITED_3, expect=Expect(expected))
    assert change == Change(recorded, changed=False)
    assert await registry.get(job.job_id) == recorded
    assert await registry.outbox_depth() == depth


async def test_expect_none_matches_a_row_with_no_identity_only(registry: Registry) -> None:
    job = await one_running(registry)
    change = await registry.finalize(job.job_id, EXITED_3, expect=Expect(None))
    assert change.changed


# -- the slot an end frees ----------------------------------------------------------------------------------


async def test_an_end_frees_one_slot_for_the_next_promotion_INV_PROMOTION_NEVER_OVERSHOOTS(
    registry: Registry,
) -> None:
    a, _b = await running(registry, ["a", "b"])
    waiting = await enqueue(registry, 3)
    change = await registry.finalize(a.job_id, SUCCEEDED)
    assert change.changed
    promotion = await registry.promote(request(2, "x", "y"))
    assert [j.job_id for j in promotion.jobs] == waiting[:1]  # one slot freed, one row (the oldest) promoted
    assert (await registry.counts())["running"] == 2


async def test_an_end_that_changed_nothing_frees_no_slot(registry: Registry) -> None:
    job = await one_running(registry)
    [queued] = await enqueue(registry, 1)
    await registry.record_identities([IdentityClaim(job.job_id, PROCESS)])
    assert not (await registry.finalize(job.job_id, EXITED_3, expect=Expect(None))).changed
    assert (await registry.promote(request(1))).jobs == ()
    assert (await registry.get(queued)).status is JobStatus.QUEUED


# -- request_cancel ------------------------------------------------------------------------------------------


async def test_cancelling_a_queued_row_ends_it_before_start(registry: Registry, clock: WallClock) -> None:
    a, b, c = await enqueue(registry, 3)
    clock.advance(3)
    change = await registry.request_cancel(b)
    assert (change.changed, change.previous) == (True, JobStatus.QUEUED)
    job = change.job
    assert (job.status, job.error_reason, job.ended_at) == (JobStatus.CANCELLED, "cancelled_before_start", clock.now)
    assert (job.queue_position, job.started_at, job.attempts) == (None, None, 0)
    assert await registry.get(b) == job
    assert [(await registry.get(x)).queue_position for x in (a, c)] == [1, 2]  # the queue closes up


async def test_cancelling_a_running_row_only_marks_the_request(registry: Registry) -> None:
    job = await one_running(registry)
    change = await registry.request_cancel(job.job_id)
    assert (change.changed, change.previous) == (True, None)
    assert (change.job.status, change.job.cancel_requested) == (JobStatus.RUNNING, True)
    assert await registry.get(job.job_id) == change.job
    again = await registry.request_cancel(job.job_id)  # asked already: nothing more to do
    assert again == Change(change.job, changed=False)


async def test_cancelling_a_terminal_row_leaves_it_alone(registry: Registry) -> None:
    job = await one_running(registry)
    ended = await registry.finalize(job.job_id, SUCCEEDED)
    depth = await registry.outbox_depth()
    assert await registry.request_cancel(job.job_id) == Change(ended.job, changed=False)
    assert await registry.get(job.job_id) == ended.job
    assert await registry.outbox_depth() == depth


async def test_cancelling_an_unknown_job_is_not_found(registry: Registry) -> None:
    with pytest.raises(JobNotFound) as err:
        await registry.request_cancel("no-such-job")
    assert err.value.job_id == "no-such-job"


# -- the job token ------------------------------------------------------------------------------------------


async def test_only_the_running_jobs_own_token_passes(registry: Registry) -> None:
    mine, theirs = await running(registry, ["mine", "theirs"])
    await registry.check_job_token(mine.job_id, "mine")
    await registry.check_job_token(theirs.job_id, "theirs")
    with pytest.raises(Unauthorized):
        await registry.check_job_token(mine.job_id, "theirs")
    with pytest.raises(Unauthorized):
        await registry.check_job_token(mine.job_id, "")


async def test_a_wrong_token_and_an_unknown_job_are_indistinguishable(registry: Registry) -> None:
    job = await one_running(registry, "mine")
    errors = []
    for job_id, token in ((job.job_id, "wrong"), ("no-such-job", "mine")):
        with pytest.raises(Unauthorized) as err:
            await registry.check_job_token(job_id, token)
        errors.append(err.value)
    wrong_token, unknown_job = errors
    assert (type(wrong_token), str(wrong_token), wrong_token.field) == (
        type(unknown_job),
        str(unknown_job),
        unknown_job.field,
    )


async def test_a_queued_row_has_no_token_yet(registry: Registry) -> None:
    [job_id] = await enqueue(registry, 1)
    assert (await registry.get(job_id)).token_hash is None
    with pytest.raises(Unauthorized):
        await registry.check_job_token(job_id, "t")


@pytest.mark.parametrize("how", ["finalize", "cancel-then-finalize"])
async def test_the_token_ends_with_the_job(registry: Registry, how: str) -> None:
    job = await one_running(registry, "mine")
    if how == "cancel-then-finalize":
        await registry.request_cancel(job.job_id)
        assert (await registry.get(job.job_id)).token_hash is not None  # still running: still its token
    await registry.finalize(job.job_id, KILLED)
    assert (await registry.get(job.job_id)).token_hash is None
    with pytest.raises(Unauthorized):
        await registry.check_job_token(job.job_id, "mine")


# -- who asked (ADR 0017) -----------------------------------------------------------------------------


async def test_a_row_names_who_enqueued_it_and_who_first_asked_for_its_cancel(registry: Registry) -> None:
    queued = await registry.enqueue(NewJob("k", {"n": 1}, ["k"], enqueued_by="ci-bot"))
    assert (queued.job.enqueued_by, queued.job.cancelled_by) == ("ci-bot", None)
    change = await registry.request_cancel(queued.job.job_id, by="ops")
    assert (change.job.status, change.job.enqueued_by, change.job.cancelled_by) == (
        JobStatus.CANCELLED,
        "ci-bot",
        "ops",
    )
    # A running one: the first request names who asked; a second changes nothing, the name included.
    job = await one_running(registry)
    first = await registry.request_cancel(job.job_id, by="alice")
    again = await registry.request_cancel(job.job_id, by="bob")
    assert (first.changed, again.changed, again.job.cancelled_by) == (True, False, "alice")
    ended = await registry.finalize(job.job_id, KILLED)
    assert (ended.job.status, ended.job.cancelled_by) == (JobStatus.CANCELLED, "alice")
    # Cancelling a finished row names no one.
    finished = await registry.request_cancel(job.job_id, by="carol")
    assert (finished.changed, finished.job.cancelled_by) == (False, "alice")
    listed, _ = await registry.list_jobs(PageRequest.parse(limit=10))
    assert {j.job_id: j.cancelled_by for j in listed}[queued.job.job_id] == "ops"
