"""Idempotency keys (ADR 0016), on every backend: a keyed request makes its rows once, in the transaction
that records the key; a retry of it answers the first answer and writes nothing; the key with another request is
refused; a rolled-back request leaves the key free; a key expires, and until then the jobs it answered are never
pruned. INV-KEY-ONCE is the name the engine's code gives the rule."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import trio
from registry_helpers import WallClock, enqueue, new_job, one_running, request

from supervisor.domain import (
    IdempotencyKey,
    IdempotencyKeyReused,
    JobStatus,
    PageRequest,
    ValidationError,
    fingerprint,
    follow_up_key,
)
from supervisor.registry import Ending, EnqueueResult, NewJob, Outcome, Registry

TTL_S = 3600.0
SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED))


def keyed(name: str, *jobs: NewJob, route: str = "enqueue") -> IdempotencyKey:
    return IdempotencyKey(name, fingerprint(route, [(job.kind, job.params) for job in jobs]), TTL_S)


async def rows(reg: Registry) -> int:
    return sum((await reg.counts()).values())


async def test_INV_KEY_ONCE_a_retry_answers_the_first_answer_and_writes_nothing(registry: Registry) -> None:
    await enqueue(registry, 2)  # the keyed job is third in the queue
    job = new_job(7)
    first = await registry.enqueue(job, key=keyed("k1", job))
    events = await registry.outbox_depth()
    again = await registry.enqueue(job, key=keyed("k1", job))
    assert first.replayed is None and again.replayed is not None
    assert again.receipt == first.receipt
    assert (again.receipt.status, again.receipt.queue_position) == (JobStatus.QUEUED, 3)
    assert (await rows(registry), await registry.outbox_depth()) == (3, events)
    assert first.job.idempotency_key == "k1" == (await registry.get(first.job.job_id)).idempotency_key


async def test_a_replay_answers_as_first_answered_while_the_row_has_moved_on(registry: Registry) -> None:
    job = new_job(1)
    first = await registry.enqueue(job, key=keyed("k", job))
    await registry.promote(request(1))
    again = await registry.enqueue(job, key=keyed("k", job))
    assert again.job.status is JobStatus.RUNNING  # the row as it is now...
    assert again.receipt == first.receipt  # ...and the answer as it was given
    assert again.receipt.status is JobStatus.QUEUED


async def test_the_key_with_another_request_is_refused_and_writes_nothing(registry: Registry) -> None:
    job = new_job(1)
    await registry.enqueue(job, key=keyed("k", job))
    other = new_job(2)
    with pytest.raises(IdempotencyKeyReused) as refused:
        await registry.enqueue(other, key=keyed("k", other))
    assert refused.value.field == "Idempotency-Key" and refused.value.code == "idempotency_key_reused"
    # A batch of the very same job is another request too (another route).
    with pytest.raises(IdempotencyKeyReused):
        await registry.enqueue_many([job], key=keyed("k", job, route="batch"))
    assert await rows(registry) == 1


async def test_INV_KEY_ONCE_many_tasks_at_once_with_one_key_make_one_row(registry: Registry) -> None:
    job = new_job(1)
    answers: list[EnqueueResult] = []

    async def send() -> None:
        result = await registry.enqueue(job, key=keyed("same", job))
        answers.append(result)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(send)
    assert len({a.receipt.job_id for a in answers}) == 1
    assert sum(a.replayed is None for a in answers) == 1
    assert await rows(registry) == 1


async def test_a_batch_key_covers_the_batch_in_order(registry: Registry) -> None:
    jobs = [new_job(n) for n in range(3)]
    key = keyed("b", *jobs, route="batch")
    first = await registry.enqueue_many(jobs, key=key)
    again = await registry.enqueue_many(jobs, key=key)
    assert [r.receipt for r in again] == [r.receipt for r in first]
    assert all(r.replayed is not None for r in again) and await rows(registry) == 3
    with pytest.raises(IdempotencyKeyReused):
        await registry.enqueue_many(jobs[::-1], key=keyed("b", *jobs[::-1], route="batch"))
    found, _ = await registry.list_jobs(PageRequest.parse(idempotency_key="b"))
    assert sorted(j.job_id for j in found) == sorted(r.job.job_id for r in first)


async def test_a_rolled_back_request_leaves_its_key_free(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    job = new_job(1)
    key = keyed("k", job)

    class Boom(Exception):
        pass

    write = registry.backend.write

    async def write_then_fail(step: Any) -> Any:
        async def fails_after_the_insert(store: Any) -> None:
            await step(store)
            raise Boom

        return await write(fails_after_the_insert)

    monkeypatch.setattr(registry.backend, "write", write_then_fail)  # the enqueue's own step, then a failure
    with pytest.raises(Boom):
        await registry.enqueue(job, key=key)
    monkeypatch.undo()
    assert await rows(registry) == 0
    result = await registry.enqueue(job, key=key)
    assert result.replayed is None and await rows(registry) == 1


async def test_a_key_expires_and_its_jobs_are_kept_until_then(registry: Registry, clock: WallClock) -> None:
    job = new_job(1)
    first = await registry.enqueue(job, key=keyed("k", job))
    running = (await registry.promote(request(1))).jobs[0]
    await registry.finalize(running.job_id, SUCCEEDED)
    await registry.outbox_delete([e.seq for e in await registry.outbox_pending(100)])
    # A live key's job is never pruned, whatever the retention says.
    assert await registry.prune_jobs(ended_before=None, keep_latest=0, limit=10) == []
    assert await registry.expire_keys() == 0
    clock.advance(TTL_S)  # expires_at is not after now: expired
    # Expired: the same key and request make a new job, and the old key's answer is gone with it.
    second = await registry.enqueue(job, key=keyed("k", job))
    assert second.replayed is None and second.job.job_id != first.job.job_id
    found, _ = await registry.list_jobs(PageRequest.parse(idempotency_key="k"))
    assert [j.job_id for j in found] == [second.job.job_id]
    gone = await registry.prune_jobs(ended_before=None, keep_latest=0, limit=10)
    assert [j.job_id for j in gone] == [first.job.job_id]


async def test_expired_keys_are_removed_by_the_sweep_and_live_ones_kept(registry: Registry, clock: WallClock) -> None:
    for n in range(3):
        job = new_job(n)
        await registry.enqueue(job, key=keyed(f"old-{n}", job))
    clock.advance(TTL_S / 2)
    live = new_job(9)
    await registry.enqueue(live, key=keyed("live", live))
    clock.advance(TTL_S / 2)
    assert await registry.expire_keys(limit=2) == 2
    assert await registry.expire_keys(limit=10) == 1
    assert await registry.expire_keys() == 0
    again = await registry.enqueue(live, key=keyed("live", live))
    assert again.replayed is not None


async def test_a_keyed_request_that_coalesces_answers_the_waiting_row_and_so_does_its_replay(
    registry: Registry,
) -> None:
    waiting = await registry.enqueue(new_job(1, key="same-args"))
    job = new_job(1, key="same-args")
    first = await registry.enqueue(job, key=keyed("k", job))
    again = await registry.enqueue(job, key=keyed("k", job))
    assert first.coalesced and first.receipt.job_id == waiting.job.job_id
    assert again.receipt == first.receipt and again.replayed is not None
    assert await rows(registry) == 1


async def test_listing_by_key_finds_the_jobs_it_answered_and_refuses_a_bad_key(registry: Registry) -> None:
    await enqueue(registry, 2)
    job = new_job(5)
    made = await registry.enqueue(job, key=keyed("find-me", job))
    found, cursor = await registry.list_jobs(PageRequest.parse(idempotency_key="find-me"))
    assert ([j.job_id for j in found], cursor) == ([made.job.job_id], None)
    assert (await registry.list_jobs(PageRequest.parse(idempotency_key="nobody's")))[0] == []
    with pytest.raises(ValidationError) as bad:
        await registry.list_jobs(PageRequest.parse(idempotency_key=" padded"))
    assert bad.value.field == "idempotency_key"


async def test_a_follow_up_is_keyed_by_its_parent_and_made_once(registry: Registry) -> None:
    job = await one_running(registry)
    then = NewJob("enrich", {"of": job.job_id}, ["enrich"])
    ending = dataclasses.replace(SUCCEEDED, then=then, then_key=keyed(follow_up_key(job.job_id), then))
    change = await registry.finalize(job.job_id, ending)
    assert change.follow_up is not None
    assert change.follow_up.job.idempotency_key == f"then/{job.job_id}"
    again = await registry.finalize(job.job_id, ending)  # the same end, run again after a lost answer
    assert (again.changed, again.follow_up) == (False, None)
    found, _ = await registry.list_jobs(PageRequest.parse(idempotency_key=f"then/{job.job_id}"))
    assert [j.job_id for j in found] == [change.follow_up.job.job_id]
    assert (await registry.counts())["queued"] == 1
