"""The registry contract: enqueue, coalescing, enqueue_many, promotion (FIFO, INV-PROMOTION-NEVER-OVERSHOOTS, the
pause, a promotion that fails) and record_identities, on every backend."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from registry_helpers import BOOT, WallClock, enqueue, new_job, one_running, request, running

from supervisor.domain import JobNotFound, JobStatus
from supervisor.registry import (
    PAUSED_BY_OPERATOR,
    Ending,
    IdentityClaim,
    IdentityRecord,
    NewJob,
    Outcome,
    PromoteRequest,
    Promotion,
    Registry,
    hash_token,
)

WAIT_S = 30.0  # a backstop for a broken test, never a timing assertion
SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)
FAILED = Ending(Outcome(JobStatus.FAILED, "exit_code_1"), exit_code=1)


async def statuses(reg: Registry, ids: Sequence[str]) -> list[JobStatus]:
    return [(await reg.get(job_id)).status for job_id in ids]


# -- enqueue ------------------------------------------------------------------------------------------------


async def test_enqueue_adds_a_queued_row(registry: Registry, clock: WallClock) -> None:
    result = await registry.enqueue(NewJob("feeds", {"feed": "a", "n": [1, 2]}, ["fetch", "a"]))
    job = result.job
    assert not result.coalesced
    assert (job.kind, job.params, job.argv) == ("feeds", {"feed": "a", "n": [1, 2]}, ["fetch", "a"])
    assert (job.status, job.queue_position, job.created_at) == (JobStatus.QUEUED, 1, clock.now)
    assert (job.attempts, job.cancel_requested, job.completed_units) == (0, False, 0)
    nothing = (job.started_at, job.ended_at, job.boot_id, job.identity, job.token_hash, job.error_reason)
    assert nothing == (None,) * 6
    assert (job.exit_code, job.total_units, job.stage, job.log_path) == (None,) * 4
    assert (job.last_heartbeat_at, job.last_progress_at, job.stalled_since) == (None, None, None)
    assert (job.stalled, job.silent) == (False, False)
    assert await registry.get(job.job_id) == job


async def test_each_row_gets_its_own_id_and_a_place_at_the_back_of_the_queue(registry: Registry) -> None:
    ids = await enqueue(registry, 3)
    assert len(set(ids)) == 3
    assert [(await registry.get(job_id)).queue_position for job_id in ids] == [1, 2, 3]
    seqs = [(await registry.get(job_id)).seq for job_id in ids]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3


async def test_a_row_handed_in_or_out_is_a_copy(registry: Registry) -> None:
    params = {"feed": {"url": "u"}}
    argv = ["fetch"]
    result = await registry.enqueue(NewJob("k", params, argv))
    params["feed"]["url"] = "changed by the caller"
    argv.append("changed by the caller")
    result.job.params["feed"] = "changed by the reader"
    result.job.argv.clear()
    (await registry.get(result.job.job_id)).params.clear()
    [promoted] = (await registry.promote(request(1))).jobs
    promoted.params["feed"]["url"] = "changed by the promoter"
    [listed] = await registry.running_jobs()
    listed.argv.append("changed by the sweeper")
    [event, *_] = await registry.outbox_pending(10)
    event.job["params"]["feed"] = "changed by the sender"
    row = await registry.get(result.job.job_id)
    assert (row.params, row.argv) == ({"feed": {"url": "u"}}, ["fetch"])
    [event, *_] = await registry.outbox_pending(10)
    assert event.job["params"] == {"feed": {"url": "u"}}


# -- coalescing ---------------------------------------------------------------------------------------------


async def test_an_identical_queued_row_absorbs_a_new_one(registry: Registry) -> None:
    await enqueue(registry, 1)  # ahead in the queue: the coalesced answer still says where the row stands
    first = await registry.enqueue(new_job(1, key="K"))
    second = await registry.enqueue(new_job(2, key="K"))
    assert (first.coalesced, second.coalesced) == (False, True)
    assert second.job == first.job  # the queued row, as it is: not the new params
    assert second.job.queue_position == 2
    assert (await registry.counts())["queued"] == 2


async def test_rows_with_another_key_or_none_are_never_coalesced(registry: Registry) -> None:
    a = await registry.enqueue(new_job(key="K"))
    b = await registry.enqueue(new_job(key="K2"))
    c = await registry.enqueue(new_job(key=None))
    d = await registry.enqueue(new_job(key=None))
    assert not any(r.coalesced for r in (a, b, c, d))
    assert len({r.job.job_id for r in (a, b, c, d)}) == 4


async def test_only_a_queued_row_absorbs_an_identical_one(registry: Registry) -> None:
    first = await registry.enqueue(new_job(key="K"))
    [promoted] = (await registry.promote(request(1))).jobs
    assert promoted.job_id == first.job.job_id
    second = await registry.enqueue(new_job(key="K"))  # the running row does not absorb it
    assert not second.coalesced and second.job.job_id != first.job.job_id
    assert second.job.status is JobStatus.QUEUED
    third = await registry.enqueue(new_job(key="K"))  # the queued one does
    assert third.coalesced and third.job.job_id == second.job.job_id
    await registry.request_cancel(second.job.job_id)
    fourth = await registry.enqueue(new_job(key="K"))  # nor does a cancelled one
    assert not fourth.coalesced and fourth.job.job_id not in {first.job.job_id, second.job.job_id}


# -- enqueue_many -------------------------------------------------------------------------------------------


async def test_enqueue_many_adds_the_rows_in_order_with_no_queue_position(registry: Registry) -> None:
    await enqueue(registry, 1)
    results = await registry.enqueue_many([new_job(i) for i in range(1, 5)])
    assert [r.job.params["n"] for r in results] == [1, 2, 3, 4]
    assert [r.coalesced for r in results] == [False] * 4
    assert {r.job.status for r in results} == {JobStatus.QUEUED}
    assert [r.job.queue_position for r in results] == [None] * 4  # the answers carry none
    assert [(await registry.get(r.job.job_id)).queue_position for r in results] == [2, 3, 4, 5]
    seqs = [r.job.seq for r in results]
    assert seqs == sorted(seqs)
    for r in results:
        stored = await registry.get(r.job.job_id)
        assert r.job.job_id == stored.job_id and r.job.params == stored.params and r.job.seq == stored.seq
    assert (await registry.running_jobs()) == []  # enqueue_many promotes nothing


async def test_enqueue_many_coalesces_with_queued_rows_and_within_the_batch(registry: Registry) -> None:
    old = await registry.enqueue(new_job(0, key="K"))
    results = await registry.enqueue_many([new_job(1, key="K"), new_job(2), new_job(3, key="L"), new_job(4, key="L")])
    assert [r.coalesced for r in results] == [True, False, False, True]
    assert results[0].job.job_id == old.job.job_id
    assert results[3].job.job_id == results[2].job.job_id
    assert (await registry.counts())["queued"] == 3


class UnreadableParams(Mapping[str, Any]):
    """Params that fail when the registry reads them: a row that cannot be written (validating params is the
    core's job; this stands for whatever makes one row of a batch fail)."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("unreadable params")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("unreadable params")

    def __len__(self) -> int:
        return 1


async def test_enqueue_many_is_all_or_nothing(registry: Registry) -> None:
    [before] = await enqueue(registry, 1)
    depth = await registry.outbox_depth()
    batch = [new_job(1), new_job(2, key="K"), NewJob("k", UnreadableParams(), ["x"])]
    with pytest.raises(RuntimeError, match="unreadable"):
        await registry.enqueue_many(batch)
    assert [j.job_id for j in (await registry.list_jobs())[0]] == [before]
    assert await registry.outbox_depth() == depth
    results = await registry.enqueue_many(batch[:2])  # the same rows, without the bad one: nothing was left over
    assert [r.coalesced for r in results] == [False, False]
    assert (await registry.counts())["queued"] == 3


async def test_an_enqueue_that_fails_writes_nothing(registry: Registry) -> None:
    with pytest.raises(RuntimeError, match="unreadable"):
        await registry.enqueue(NewJob("k", UnreadableParams(), ["x"]))
    assert await registry.counts() == {s.value: 0 for s in JobStatus}
    assert await registry.outbox_depth() == 0


async def test_enqueue_many_of_nothing_adds_nothing(registry: Registry) -> None:
    assert await registry.enqueue_many([]) == []
    assert sum((await registry.counts()).values()) == 0
    assert await registry.outbox_depth() == 0


# -- promotion ----------------------------------------------------------------------------------------------


async def test_promotion_is_fifo_and_records_the_boot_the_start_the_token_and_the_log(
    registry: Registry, clock: WallClock, tmp_path: Path
) -> None:
    ids = await enqueue(registry, 4)
    clock.advance(5)
    promotion = await registry.promote(
        PromoteRequest(3, "boot-x", [hash_token("one"), hash_token("two")], log_dir=tmp_path / "logs")
    )
    assert not promotion.paused
    assert [j.job_id for j in promotion.jobs] == ids[:2]  # the oldest first, one per token
    for job, token in zip(promotion.jobs, ("one", "two"), strict=True):
        assert job.status is JobStatus.RUNNING
        assert (job.boot_id, job.started_at, job.attempts) == ("boot-x", clock.now, 1)
        assert job.token_hash == hash_token(token)
        assert job.log_path == str(tmp_path / "logs" / f"{job.job_id}.log")
        assert (job.identity, job.queue_position, job.ended_at) == (None, None, None)
        assert await registry.get(job.job_id) == job  # what the call answers is the row as stored
    assert await statuses(registry, ids) == [JobStatus.RUNNING] * 2 + [JobStatus.QUEUED] * 2
    assert [(await registry.get(job_id)).queue_position for job_id in ids[2:]] == [1, 2]


async def test_a_promotion_without_a_log_dir_records_no_log_path(registry: Registry) -> None:
    await enqueue(registry, 1)
    [job] = (await registry.promote(request(1))).jobs
    assert job.log_path is None


async def test_fifo_skips_rows_that_left_the_queue(registry: Registry) -> None:
    a, b, c = await enqueue(registry, 3)
    await registry.request_cancel(a)
    promoted = [j.job_id for j in (await registry.promote(request(5, "x", "y", "z"))).jobs]
    assert promoted == [b, c]


async def test_promotion_never_overshoots_max_concurrent_INV_PROMOTION_NEVER_OVERSHOOTS(registry: Registry) -> None:
    await enqueue(registry, 5)
    first = await registry.promote(request(2, "a", "b", "c"))
    assert len(first.jobs) == 2
    for _ in range(3):
        assert (await registry.promote(request(2, "d", "e"))).jobs == ()
    assert (await registry.counts())["running"] == 2
    more = await registry.promote(request(3, "f", "g"))  # a third slot: one more, whatever the tokens
    assert len(more.jobs) == 1
    assert (await registry.promote(request(0, "h"))).jobs == ()
    counts = await registry.counts()
    assert counts == {"queued": 2, "running": 3, "succeeded": 0, "failed": 0, "cancelled": 0, "stale": 0}


async def test_a_promotion_with_nothing_queued_promotes_nothing(registry: Registry) -> None:
    assert await registry.promote(request(4)) == Promotion()
    await one_running(registry)
    assert await registry.promote(request(4)) == Promotion()


async def test_many_concurrent_promotions_never_overshoot_INV_PROMOTION_NEVER_OVERSHOOTS(registry: Registry) -> None:
    ids = await enqueue(registry, 20)
    promoted: list[str] = []

    async def promote(i: int) -> None:
        promotion = await registry.promote(request(3, f"{i}-a", f"{i}-b"))
        promoted.extend(j.job_id for j in promotion.jobs)

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            for i in range(30):
                nursery.start_soon(promote, i)
    assert sorted(promoted) == sorted(ids[:3])  # three, the oldest, none twice
    assert [j.job_id for j in await registry.running_jobs()] == ids[:3]


async def test_concurrent_drains_promote_every_row_once_and_never_overshoot_INV_PROMOTION_NEVER_OVERSHOOTS(
    registry: Registry,
) -> None:
    """Tasks promote and end rows at once. A row counts here from the moment its promotion returned until its
    finalize is called: all along it is RUNNING in the registry, so this count is never above the registry's. (Not
    until the finalize returns: the row may be ended, and its slot taken, before its caller resumes.)"""
    max_concurrent = 2
    ids = await enqueue(registry, 16)
    promoted: list[str] = []
    in_flight = 0
    peak = 0

    async def drain(worker: int) -> None:
        nonlocal in_flight, peak
        for attempt in range(10_000):
            promotion = await registry.promote(request(max_concurrent, f"{worker}-{attempt}"))
            if not promotion.jobs:
                if (await registry.counts())["queued"] == 0:
                    return
                continue  # the slots are taken: another task frees them (each call yields to it)
            [job] = promotion.jobs
            promoted.append(job.job_id)
            in_flight += 1
            peak = max(peak, in_flight)
            assert (await registry.counts())["running"] <= max_concurrent  # the others try to overshoot meanwhile
            in_flight -= 1
            change = await registry.finalize(job.job_id, SUCCEEDED)
            assert change.changed
        raise AssertionError("a drain never finished")

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            for worker in range(6):
                nursery.start_soon(drain, worker)
    assert sorted(promoted) == sorted(ids)
    assert 1 <= peak <= max_concurrent
    assert (await registry.counts())["succeeded"] == 16


# -- the pause ----------------------------------------------------------------------------------------------


async def test_a_paused_queue_promotes_nothing_until_resumed(registry: Registry) -> None:
    ids = await enqueue(registry, 2)
    await registry.set_paused(True, by=PAUSED_BY_OPERATOR)
    assert await registry.promote(request(2, "a", "b")) == Promotion(paused=True)
    assert await statuses(registry, ids) == [JobStatus.QUEUED] * 2
    await registry.set_paused(False, by=PAUSED_BY_OPERATOR)
    assert [j.job_id for j in (await registry.promote(request(2, "a", "b"))).jobs] == ids


# -- a promotion that fails ---------------------------------------------------------------------------------


class FailingHashes(Sequence[str]):
    """Token hashes that fail after the first: a promotion that breaks down halfway (here by its input, in a real
    registry by its storage); the promotion must then be undone as a whole."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: Any) -> Any:
        if i == 0:
            return hash_token("first")
        raise RuntimeError("the promotion broke down halfway")


async def test_a_promotion_that_fails_halfway_raises_and_changes_nothing(registry: Registry) -> None:
    ids = await enqueue(registry, 2)
    depth = await registry.outbox_depth()
    with pytest.raises(RuntimeError, match="halfway"):
        await registry.promote(PromoteRequest(5, BOOT, FailingHashes()))
    assert await statuses(registry, ids) == [JobStatus.QUEUED] * 2
    assert await registry.outbox_depth() == depth


# -- record_identities --------------------------------------------------------------------------------------

PROCESS = IdentityRecord("process", {"pid": 4242, "pid_start_time": 99, "kernel_boot_id": "kb"})
CONTAINER = IdentityRecord("container", {"container_id": "c0ffee"})


async def test_record_identities_records_each_claim_and_answers_the_rows_in_order(registry: Registry) -> None:
    a, b = await running(registry, ["a", "b"])
    rows = await registry.record_identities([IdentityClaim(b.job_id, CONTAINER), IdentityClaim(a.job_id, PROCESS)])
    assert [(r.job_id, r.identity) for r in rows] == [(b.job_id, CONTAINER), (a.job_id, PROCESS)]
    assert (await registry.get(a.job_id)).identity == PROCESS
    assert (await registry.get(b.job_id)).spawned
    assert rows[0] == await registry.get(b.job_id)
    # The record is the executor's, stored whole: another record replaces it, fields and all.
    other = IdentityRecord("process", {"pid": 4243})
    [again] = await registry.record_identities([IdentityClaim(a.job_id, other)])
    assert again.identity == other and dict(again.identity.fields) == {"pid": 4243}


async def test_record_identities_leaves_a_row_that_no_longer_runs_alone(registry: Registry) -> None:
    job = await one_running(registry)
    [queued] = await enqueue(registry, 1)
    await registry.finalize(job.job_id, FAILED)
    before = [await registry.get(job.job_id), await registry.get(queued)]
    rows = await registry.record_identities([IdentityClaim(job.job_id, PROCESS), IdentityClaim(queued, PROCESS)])
    assert rows == before
    assert [await registry.get(job.job_id), await registry.get(queued)] == before


async def test_record_identities_for_an_unknown_job_records_none_of_the_batch(registry: Registry) -> None:
    job = await one_running(registry)
    with pytest.raises(JobNotFound):
        await registry.record_identities([IdentityClaim(job.job_id, PROCESS), IdentityClaim("no-such-job", PROCESS)])
    assert (await registry.get(job.job_id)).identity is None


async def test_the_oldest_waiting_row_is_read_in_a_read_only_snapshot(registry: Registry) -> None:
    """The queue's watch's read (at every sweep): the row that runs next, in a read-only snapshot (on
    PostgreSQL a FOR UPDATE there is refused: the watch could never look), or None when nothing waits."""
    assert await registry.oldest_waiting() is None
    ids = await enqueue(registry, 3)
    oldest = await registry.oldest_waiting()
    assert oldest is not None and oldest.job_id == ids[0]
    [first] = (await registry.promote(request(1))).jobs
    assert first.job_id == ids[0]
    oldest = await registry.oldest_waiting()
    assert oldest is not None and oldest.job_id == ids[1]
