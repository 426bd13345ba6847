"""The registry contract: the transactional outbox. Each change writes its events with it, in order, each carrying
the public row as of the change and the writer's boot; a change that changes nothing, or fails, writes none;
delivered events are deleted, and the backlog is pruned by age and by count. On every backend."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pytest
from registry_helpers import WallClock, enqueue, new_job, one_running, request

from supervisor.domain import IllegalTransition, Job, JobStatus
from supervisor.registry import (
    Beat,
    Ending,
    IdentityClaim,
    IdentityRecord,
    OutboxEvent,
    Outcome,
    PruneResult,
    Registry,
)

EXITED_3 = Ending(Outcome(JobStatus.FAILED, "exit_code_3"), exit_code=3)
SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)


def snapshot(job: Job) -> dict[str, Any]:
    """What an event's ``job`` must equal: the public row (an event carries no queue position: it would be stale
    by the time anyone reads it)."""
    public = job.public()
    public.pop("queue_position", None)
    return public


def without_position(job: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(job)
    out.pop("queue_position", None)
    return out


def summary(events: list[OutboxEvent]) -> list[tuple[str, str | None, str | None, str]]:
    return [(e.event, e.previous_status, e.reason, e.job["status"]) for e in events]


async def test_each_change_writes_its_events_in_order_with_the_row_as_of_the_change(
    open_registry: Any, clock: WallClock
) -> None:
    registry: Registry = await open_registry(boot_id="boot-1")
    # (job id, event, the row right after the change, the time of the change)
    expected: list[tuple[str, str, dict[str, Any], datetime]] = []

    async def after(job_id: str, event: str) -> None:
        expected.append((job_id, event, snapshot(await registry.get(job_id)), clock.now))
        clock.advance(1)  # each change at its own instant

    first = await registry.enqueue(new_job(1))
    a = first.job.job_id
    await after(a, "job.transition")
    # A promotion asked by another boot: the event still says who wrote it.
    [running] = (await registry.promote(request(1, "t", boot_id="boot-x"))).jobs
    await after(a, "job.transition")
    await registry.record_identities([IdentityClaim(a, IdentityRecord("process", {"pid": 7}))])  # no event
    await registry.set_absence(a, stalled=True, silent=False, events=[("job.stalled", "progress_stalled")])
    await after(a, "job.stalled")
    await registry.set_absence(a, stalled=False, silent=False, events=[("job.recovered", "a"), ("job.other", "b")])
    await after(a, "job.recovered")
    expected.append((a, "job.other", *expected[-1][2:]))
    await registry.record_event(a, "job.adopted", "adopted_after_restart")
    await after(a, "job.adopted")
    await registry.finalize(a, EXITED_3)
    await after(a, "job.transition")
    second = await registry.enqueue(new_job(2))
    b = second.job.job_id
    await after(b, "job.transition")
    await registry.request_cancel(b)
    await after(b, "job.transition")

    events = await registry.outbox_pending(100)
    assert summary(events) == [
        ("job.transition", None, "enqueued", "queued"),
        ("job.transition", "queued", "promoted", "running"),
        ("job.stalled", "running", "progress_stalled", "running"),
        ("job.recovered", "running", "a", "running"),
        ("job.other", "running", "b", "running"),
        ("job.adopted", "running", "adopted_after_restart", "running"),
        ("job.transition", "running", "exit_code_3", "failed"),
        ("job.transition", None, "enqueued", "queued"),
        ("job.transition", "queued", "cancelled_before_start", "cancelled"),
    ]
    assert [(e.job_id, e.event, e.created_at) for e in events] == [(x[0], x[1], x[3]) for x in expected]
    for event, (_, _, row, _) in zip(events, expected, strict=True):
        assert without_position(event.job) == row
    assert events[1].job["boot_id"] == "boot-x" == running.boot_id  # the row's boot: the promotion's
    assert {e.boot_id for e in events} == {"boot-1"}  # the event's boot: the writer's
    assert events[2].job["pid"] == 7  # the identity's fields, where the API shows them
    assert events[6].job["exit_code"] == 3
    assert all("token_hash" not in e.job for e in events)
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert len({e.event_id for e in events}) == len(events)
    assert await registry.outbox_depth() == len(events)


async def test_enqueue_many_writes_one_event_per_new_row_in_order(registry: Registry) -> None:
    results = await registry.enqueue_many([new_job(1, key="K"), new_job(2), new_job(3, key="K")])
    events = await registry.outbox_pending(10)
    assert [(e.job_id, e.reason) for e in events] == [(r.job.job_id, "enqueued") for r in results[:2]]


async def test_an_enqueue_then_a_promotion_write_their_events_in_that_order(registry: Registry) -> None:
    result = await registry.enqueue(new_job())
    await registry.promote(request(1))
    events = await registry.outbox_pending(10)
    assert [(e.job_id, e.previous_status, e.reason) for e in events] == [
        (result.job.job_id, None, "enqueued"),
        (result.job.job_id, "queued", "promoted"),
    ]


async def test_an_end_then_a_promotion_write_their_events_in_that_order(registry: Registry) -> None:
    job = await one_running(registry)
    [queued] = await enqueue(registry, 1)
    depth = await registry.outbox_depth()
    await registry.finalize(job.job_id, SUCCEEDED)
    await registry.promote(request(1))
    events = (await registry.outbox_pending(100))[depth:]
    assert [(e.job_id, e.previous_status, e.job["status"]) for e in events] == [
        (job.job_id, "running", "succeeded"),
        (queued, "queued", "running"),
    ]


async def test_a_change_that_changes_nothing_writes_no_event(registry: Registry) -> None:
    job = await one_running(registry, "t")
    await registry.finalize(job.job_id, SUCCEEDED)
    depth = await registry.outbox_depth()
    assert not (await registry.finalize(job.job_id, EXITED_3)).changed  # already terminal
    assert not (await registry.request_cancel(job.job_id)).changed
    await registry.record_heartbeats([Beat(job.job_id, "t", 1)])  # refused
    assert not (await registry.set_absence(job.job_id, stalled=True, silent=True, events=[("job.x", "y")])).changed
    await registry.enqueue(new_job(key="key"))
    assert await registry.outbox_depth() == depth + 1
    await registry.enqueue(new_job(key="key"))  # coalesced into the first
    assert (await registry.promote(request(0))).jobs == ()  # no slot: nothing promoted
    assert await registry.outbox_depth() == depth + 1


async def test_a_cancel_request_on_a_running_row_is_no_status_change_and_no_event(registry: Registry) -> None:
    job = await one_running(registry)
    depth = await registry.outbox_depth()
    assert (await registry.request_cancel(job.job_id)).changed
    assert await registry.outbox_depth() == depth


async def test_heartbeats_write_no_event(registry: Registry) -> None:
    job = await one_running(registry, "t")
    depth = await registry.outbox_depth()
    await registry.record_heartbeats([Beat(job.job_id, "t", 3, stage="s")])
    assert await registry.outbox_depth() == depth


async def test_a_change_that_fails_writes_no_event(registry: Registry) -> None:
    [queued] = await enqueue(registry, 1)
    depth = await registry.outbox_depth()
    with pytest.raises(IllegalTransition):
        await registry.finalize(queued, SUCCEEDED)
    assert await registry.outbox_depth() == depth


async def test_a_registry_without_an_outbox_writes_no_event(open_registry: Any) -> None:
    registry: Registry = await open_registry(outbox=False)
    job = await one_running(registry, "t")
    [queued] = await enqueue(registry, 1)
    await registry.set_absence(job.job_id, stalled=True, silent=False, events=[("job.stalled", "x")])
    await registry.record_event(job.job_id, "job.adopted", None)
    await registry.finalize(job.job_id, SUCCEEDED)
    await registry.promote(request(1))
    await registry.request_cancel(queued)
    await registry.enqueue_many([new_job(1), new_job(2)])
    assert await registry.outbox_depth() == 0
    assert await registry.outbox_pending(10) == []
    assert (await registry.counts())["succeeded"] == 1  # the changes themselves were made


# -- reading, deleting, pruning -------------------------------------------------------------------------------


async def test_pending_answers_the_oldest_events_first_up_to_the_limit(registry: Registry) -> None:
    ids = await enqueue(registry, 5)
    events = await registry.outbox_pending(3)
    assert [e.job_id for e in events] == ids[:3]
    assert [e.job_id for e in await registry.outbox_pending(100)] == ids


async def test_delete_forgets_only_what_was_delivered(registry: Registry) -> None:
    await enqueue(registry, 4)
    first, second, third, fourth = await registry.outbox_pending(10)
    await registry.outbox_delete([first.seq, third.seq])
    assert await registry.outbox_pending(10) == [second, fourth]
    await registry.outbox_delete([first.seq])  # delivered twice (a retry after a crash): nothing more to forget
    await registry.outbox_delete([])
    assert await registry.outbox_depth() == 2
    [fifth] = await enqueue(registry, 1, start=5)
    assert [e.job_id for e in await registry.outbox_pending(10)] == [second.job_id, fourth.job_id, fifth]


async def test_prune_drops_events_older_than_the_age_limit(registry: Registry, clock: WallClock) -> None:
    await enqueue(registry, 1)  # t0
    clock.advance(10)
    await enqueue(registry, 1, start=1)  # t0 + 10
    clock.advance(10)
    [kept] = await enqueue(registry, 1, start=2)  # t0 + 20
    clock.advance(5)  # now t0 + 25: older than 15 s is older than t0 + 10
    assert await registry.outbox_prune(max_events=100, max_age_s=15) == PruneResult(by_age=1, by_count=0)
    clock.advance(0.5)
    result = await registry.outbox_prune(max_events=100, max_age_s=10)
    assert (result.by_age, result.by_count, result.dropped) == (1, 0, 1)
    assert [e.job_id for e in await registry.outbox_pending(10)] == [kept]


async def test_an_event_exactly_as_old_as_the_limit_is_kept(registry: Registry, clock: WallClock) -> None:
    await enqueue(registry, 1)
    clock.advance(10)
    assert await registry.outbox_prune(max_events=100, max_age_s=10) == PruneResult(0, 0)
    assert await registry.outbox_depth() == 1


async def test_prune_drops_the_oldest_events_past_the_count_limit(registry: Registry) -> None:
    ids = await enqueue(registry, 5)
    result = await registry.outbox_prune(max_events=2, max_age_s=3600)
    assert (result.by_age, result.by_count, result.dropped) == (0, 3, 3)
    assert [e.job_id for e in await registry.outbox_pending(10)] == ids[3:]


async def test_prune_counts_what_is_left_after_the_age_limit(registry: Registry, clock: WallClock) -> None:
    await enqueue(registry, 2)
    clock.advance(100)
    ids = await enqueue(registry, 3, start=2)
    assert await registry.outbox_prune(max_events=2, max_age_s=50) == PruneResult(by_age=2, by_count=1)
    assert [e.job_id for e in await registry.outbox_pending(10)] == ids[1:]


async def test_prune_with_nothing_to_drop_drops_nothing(registry: Registry) -> None:
    assert await registry.outbox_prune(max_events=10, max_age_s=60) == PruneResult(0, 0)
    await enqueue(registry, 2)
    assert await registry.outbox_prune(max_events=10, max_age_s=60) == PruneResult(0, 0)
    assert await registry.outbox_depth() == 2
