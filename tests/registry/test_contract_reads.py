"""The registry contract: reads (get and queue positions, running_jobs, list_jobs and its cursor, counts), the
queue's pause, timestamps (aware, UTC, from the registry's clock), and a closed registry, on every backend."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from registry_helpers import WallClock, enqueue, new_job, one_running, request, running

from supervisor.domain import (
    MAX_LIST_LIMIT,
    IdempotencyKey,
    Job,
    JobFilter,
    JobNotFound,
    JobStatus,
    PageRequest,
    RegistryError,
    ValidationError,
)
from supervisor.registry import (
    PAUSED_BY_FILE,
    PAUSED_BY_OPERATOR,
    Beat,
    Ending,
    Expect,
    IdentityClaim,
    IdentityRecord,
    Outcome,
    PauseState,
    Registry,
)

SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)


# -- get ---------------------------------------------------------------------------------------------------


async def test_get_an_unknown_job_is_not_found(registry: Registry) -> None:
    with pytest.raises(JobNotFound) as err:
        await registry.get("no-such-job")
    assert (err.value.job_id, err.value.field) == ("no-such-job", "job_id")


async def test_only_a_queued_row_carries_a_queue_position(registry: Registry) -> None:
    job = await one_running(registry)
    a, b = await enqueue(registry, 2)
    assert [(await registry.get(x)).queue_position for x in (a, b)] == [1, 2]
    assert (await registry.get(job.job_id)).queue_position is None
    await registry.finalize(job.job_id, SUCCEEDED)
    await registry.promote(request(1))  # a leaves the queue for the freed slot
    assert [(await registry.get(x)).queue_position for x in (a, b)] == [None, 1]
    assert (await registry.get(job.job_id)).queue_position is None


# -- running_jobs ------------------------------------------------------------------------------------------


async def test_running_jobs_are_every_running_row_oldest_first(registry: Registry) -> None:
    assert await registry.running_jobs() == []
    ids = await enqueue(registry, 5)
    await registry.promote(request(4, "a", "b", "c", "d"))
    await registry.finalize(ids[1], SUCCEEDED)
    await registry.request_cancel(ids[2])  # still running: asked to stop
    rows = await registry.running_jobs()
    assert [r.job_id for r in rows] == [ids[0], ids[2], ids[3]]
    assert rows == [await registry.get(r.job_id) for r in rows]


# -- list_jobs ---------------------------------------------------------------------------------------------


async def test_list_is_newest_first_and_pages_never_shift_when_rows_are_added(registry: Registry) -> None:
    ids = await enqueue(registry, 5)
    page1, cursor = await registry.list_jobs(PageRequest.parse(limit=2))
    assert [j.job_id for j in page1] == ids[::-1][:2]
    assert cursor is not None
    await enqueue(registry, 3, start=5)  # newer rows go on top: they never shift the pages being read
    page2, cursor2 = await registry.list_jobs(PageRequest.parse(limit=2, cursor=cursor))
    page3, cursor3 = await registry.list_jobs(PageRequest.parse(limit=2, cursor=cursor2))
    assert [j.job_id for j in page2 + page3] == ids[::-1][2:]
    assert cursor3 is None  # the last page says so: no empty page after it
    assert [j.queue_position for j in page1 + page2 + page3] == [5, 4, 3, 2, 1]
    assert page1 + page2 + page3 == [await registry.get(x) for x in ids[::-1]]


async def test_a_page_that_ends_exactly_at_the_last_row_has_no_cursor(registry: Registry) -> None:
    ids = await enqueue(registry, 4)
    page1, cursor = await registry.list_jobs(PageRequest.parse(limit=2))
    page2, cursor2 = await registry.list_jobs(PageRequest.parse(limit=2, cursor=cursor))
    assert [j.job_id for j in page1 + page2] == ids[::-1]
    assert cursor2 is None
    everything, none = await registry.list_jobs(PageRequest.parse(limit=MAX_LIST_LIMIT))
    assert ([j.job_id for j in everything], none) == (ids[::-1], None)


async def test_list_filters_by_status_and_kind(registry: Registry) -> None:
    a1, a2 = await enqueue(registry, 2, kind="a")
    [b1] = await enqueue(registry, 1, kind="b", start=2)
    await registry.promote(request(1))  # a1
    [b2] = await enqueue(registry, 1, kind="b", start=3)
    assert [j.job_id for j in (await registry.list_jobs(PageRequest.parse(kind="b")))[0]] == [b2, b1]
    assert [j.job_id for j in (await registry.list_jobs(PageRequest.parse(status="queued")))[0]] == [b2, b1, a2]
    assert [j.job_id for j in (await registry.list_jobs(PageRequest.parse(status="running")))[0]] == [a1]
    assert [j.job_id for j in (await registry.list_jobs(PageRequest.parse(status="queued", kind="a")))[0]] == [a2]
    assert (await registry.list_jobs(PageRequest.parse(status="failed"))) == ([], None)
    assert (await registry.list_jobs(PageRequest.parse(kind="nope"))) == ([], None)
    page, cursor = await registry.list_jobs(PageRequest.parse(status="queued", limit=1))
    assert [j.job_id for j in page] == [b2]
    # The cursor keeps the filter's order.
    rest, _ = await registry.list_jobs(PageRequest.parse(status="queued", cursor=cursor))
    assert [j.job_id for j in rest] == [b1, a2]


async def test_a_cursor_past_every_row_answers_an_empty_page(registry: Registry) -> None:
    await enqueue(registry, 2)
    assert await registry.list_jobs(PageRequest.parse(cursor="0")) == ([], None)
    assert await registry.list_jobs(PageRequest.parse(cursor="1")) == ([], None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"status": "bogus"}, "status"),
        ({"status": "QUEUED"}, "status"),
        ({"limit": 0}, "limit"),
        ({"limit": -1}, "limit"),
        ({"limit": MAX_LIST_LIMIT + 1}, "limit"),
        ({"cursor": "x"}, "cursor"),
        ({"cursor": ""}, "cursor"),
        ({"cursor": "-3"}, "cursor"),
        ({"cursor": "1_0"}, "cursor"),
        ({"cursor": " 1"}, "cursor"),
        ({"cursor": "\u0663"}, "cursor"),  # a non-ASCII digit
        ({"cursor": "9" * 19}, "cursor"),  # more than a row number ever holds
    ],
)
async def test_a_bad_status_limit_or_cursor_is_a_validation_error_naming_it(
    registry: Registry, kwargs: dict[str, Any], field: str
) -> None:
    await enqueue(registry, 1)
    with pytest.raises(ValidationError) as err:
        await registry.list_jobs(PageRequest.parse(**kwargs))
    assert err.value.field == field


# -- counts ------------------------------------------------------------------------------------------------


async def test_counts_cover_every_status(registry: Registry) -> None:
    assert await registry.counts() == {s.value: 0 for s in JobStatus}
    a, b = await running(registry, ["a", "b"])
    await registry.finalize(a.job_id, Ending(Outcome(JobStatus.STALE, "no_heartbeat")))
    await registry.finalize(b.job_id, Ending(Outcome(JobStatus.FAILED, "exit_code_1"), exit_code=1))
    c, d, e, _f = await enqueue(registry, 4)
    await registry.request_cancel(c)
    await registry.promote(request(2, "d", "e"))
    await registry.finalize(d, SUCCEEDED)
    assert await registry.counts() == {
        "queued": 1,
        "running": 1,
        "succeeded": 1,
        "failed": 1,
        "cancelled": 1,
        "stale": 1,
    }
    assert (await registry.get(e)).status is JobStatus.RUNNING


# -- the pause ---------------------------------------------------------------------------------------------


async def test_pause_state_says_who_paused_and_since_when(registry: Registry, clock: WallClock) -> None:
    assert await registry.pause_state() == PauseState(False)
    paused_at = clock.advance(10)
    state = await registry.set_paused(True, by=PAUSED_BY_OPERATOR)
    assert state == PauseState(True, PAUSED_BY_OPERATOR, paused_at)
    assert await registry.pause_state() == state
    clock.advance(10)
    # Paused already: the pause stays the first one's (who and since when).
    assert await registry.set_paused(True, by=PAUSED_BY_FILE) == state
    assert await registry.pause_state() == state
    clock.advance(10)
    assert await registry.set_paused(False, by=PAUSED_BY_OPERATOR) == PauseState(False)
    assert await registry.pause_state() == PauseState(False)
    assert await registry.set_paused(False, by=PAUSED_BY_FILE) == PauseState(False)  # resumed already
    again_at = clock.advance(10)
    assert await registry.set_paused(True, by=PAUSED_BY_FILE) == PauseState(True, PAUSED_BY_FILE, again_at)


async def test_an_operators_pause_takes_over_a_files_so_only_a_resume_ends_it(
    registry: Registry, clock: WallClock
) -> None:
    """The file paused first, the operator paused too; the pause stayed the file's, and the file's removal
    (its host's resume, ``by`` the file) ended the operator's pause."""
    paused_at = clock.advance(10)
    await registry.set_paused(True, by=PAUSED_BY_FILE)
    clock.advance(10)
    taken = await registry.set_paused(True, by=PAUSED_BY_OPERATOR)
    assert taken == PauseState(True, PAUSED_BY_OPERATOR, paused_at)  # the operator's now, paused since the first
    assert await registry.pause_state() == taken
    # What the file's removal does (PauseFile._mirror): it resumes only a pause that is the file's.
    assert (await registry.pause_state()).by != PAUSED_BY_FILE
    # A file that pauses again never takes it back.
    assert await registry.set_paused(True, by=PAUSED_BY_FILE) == taken


# -- timestamps --------------------------------------------------------------------------------------------


def _timestamps(job: Job) -> list[datetime]:
    names = ("created_at", "started_at", "ended_at", "last_heartbeat_at", "last_progress_at", "stalled_since")
    return [getattr(job, name) for name in names if getattr(job, name) is not None]


async def test_every_timestamp_is_an_aware_utc_datetime_from_the_registrys_clock(open_registry: Any) -> None:
    """The clock may be in any zone: the registry answers the same instants, in UTC, from every call."""
    east = timezone(timedelta(hours=2))
    clock = WallClock(datetime(2031, 3, 4, 7, 6, 7, 123456, tzinfo=east))
    registry: Registry = await open_registry(clock=clock)
    seen: list[datetime] = []

    def saw(*jobs: Job | Any) -> None:
        for job in jobs:
            if isinstance(job, Job):
                seen.extend(_timestamps(job))

    result = await registry.enqueue(new_job(1))
    saw(result.job)
    saw(*(r.job for r in await registry.enqueue_many([new_job(2), new_job(3)])))
    clock.advance(1)
    saw(*(await registry.promote(request(2, "a", "b"))).jobs)
    clock.advance(1)
    saw(*await registry.record_heartbeats([Beat(result.job.job_id, "a", 1)]))
    clock.advance(1)
    saw((await registry.set_absence(result.job.job_id, stalled=True, silent=False)).job)
    saw(*await registry.record_identities([IdentityClaim(result.job.job_id, IdentityRecord("process", {"pid": 1}))]))
    clock.advance(1)
    change = await registry.finalize(result.job.job_id, SUCCEEDED)
    saw(change.job, *(await registry.promote(request(2, "c"))).jobs)
    saw((await registry.request_cancel(change.job.job_id)).job)
    saw(*await registry.running_jobs(), *(await registry.list_jobs())[0], await registry.get(result.job.job_id))
    pause = await registry.set_paused(True, by=PAUSED_BY_OPERATOR)
    assert pause.since is not None
    seen.append(pause.since)
    since = (await registry.pause_state()).since
    assert since is not None
    seen.append(since)
    seen.extend(e.created_at for e in await registry.outbox_pending(100))

    assert len(seen) > 20
    for ts in seen:
        assert ts.tzinfo is not None and ts.utcoffset() == timedelta(0), ts
    start = clock.now - timedelta(seconds=4)
    assert min(seen) == start.astimezone(UTC)  # the same instants as the clock's, to the microsecond
    assert max(seen) == clock.now


async def test_a_clock_without_a_zone_is_refused_and_nothing_is_written(open_registry: Any) -> None:
    registry: Registry = await open_registry(clock=lambda: datetime(2031, 3, 4, 5, 6, 7))
    with pytest.raises(ValueError, match="naive"):
        await registry.enqueue(new_job())
    assert await registry.counts() == {s.value: 0 for s in JobStatus}
    assert await registry.outbox_depth() == 0


# -- a closed registry -------------------------------------------------------------------------------------

CALLS: dict[str, Callable[[Registry], Awaitable[object]]] = {
    "enqueue": lambda r: r.enqueue(new_job()),
    "enqueue_many": lambda r: r.enqueue_many([new_job()]),
    "promote": lambda r: r.promote(request(1)),
    "record_identities": lambda r: r.record_identities([IdentityClaim("x", IdentityRecord("process", {}))]),
    "finalize": lambda r: r.finalize("x", SUCCEEDED),
    "request_cancel": lambda r: r.request_cancel("x"),
    "request_stop": lambda r: r.request_stop("x", "deadline", expect=Expect(None)),
    "requeue": lambda r: r.requeue("x", expect=Expect(None), reason="never_started"),
    "record_heartbeats": lambda r: r.record_heartbeats([Beat("x", "t", 1)]),
    "check_job_token": lambda r: r.check_job_token("x", "t"),
    "set_absence": lambda r: r.set_absence("x", stalled=True, silent=False),
    "record_event": lambda r: r.record_event("x", "job.adopted", None),
    "outbox_pending": lambda r: r.outbox_pending(10),
    "outbox_delete": lambda r: r.outbox_delete([1]),
    "outbox_delete_nothing": lambda r: r.outbox_delete([]),
    "outbox_depth": lambda r: r.outbox_depth(),
    "outbox_prune": lambda r: r.outbox_prune(max_events=0, max_age_s=0),
    "set_paused": lambda r: r.set_paused(True, by=PAUSED_BY_OPERATOR),
    "pause_state": lambda r: r.pause_state(),
    "get": lambda r: r.get("x"),
    "running_jobs": lambda r: r.running_jobs(),
    "list_jobs": lambda r: r.list_jobs(),
    "counts": lambda r: r.counts(),
    "retries_of": lambda r: r.retries_of("j"),
    "prune_jobs": lambda r: r.prune_jobs(ended_before=None, keep_latest=0, limit=1),
    "expire_keys": lambda r: r.expire_keys(limit=1),
    "oldest_waiting": lambda r: r.oldest_waiting(),
    "kind_counts": lambda r: r.kind_counts(),
    "select_ids": lambda r: r.select_ids(JobFilter(), 10),
    "newest_of_schedules": lambda r: r.newest_of_schedules(),
    "answer_of": lambda r: r.answer_of(IdempotencyKey("k", "f", 60.0)),
    "drop_settings": lambda r: r.drop_settings("bulk/", datetime(2030, 1, 1, tzinfo=UTC)),
    "setting": lambda r: r.setting("max_concurrent"),
    "record_queue_event": lambda r: r.record_queue_event(
        "queue.stuck", host_id="h", job_id="j", details={}, reason="pause_file", announced=""
    ),
    "renew_lease": lambda r: r.renew_lease("h", "b", lease_s=10, lead=True),
    "release_lease": lambda r: r.release_lease("h", "b"),
    "hosts": lambda r: r.hosts(),
    "leader": lambda r: r.leader(),
    "forget_host": lambda r: r.forget_host("h"),
    "set_drained": lambda r: r.set_drained("h", True),
    "drained": lambda r: r.drained(),
    "record_setting": lambda r: r.record_setting("max_concurrent", "1", "h", replace=False),
}


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_every_call_after_aclose_raises_registry_error(registry: Registry, call: str) -> None:
    await enqueue(registry, 1)
    await registry.aclose()
    with pytest.raises(RegistryError):
        await CALLS[call](registry)
    await registry.aclose()  # closing twice is harmless


async def test_the_backend_implements_every_operation_of_the_protocol_as_a_coroutine(registry: Registry) -> None:
    operations = {name for name, value in vars(Registry).items() if callable(value) and not name.startswith("_")}
    assert isinstance(registry, Registry)
    # fault() is the one plain method: health answers it without touching the store, so it cannot wait on it
    operations.discard("fault")
    assert not inspect.iscoroutinefunction(registry.fault)
    assert registry.fault() is None
    # listen() is the other: it gives an async context manager (entering it connects: test_contract_wakeups.py)
    operations.discard("listen")
    assert not inspect.iscoroutinefunction(registry.listen)
    assert all(inspect.iscoroutinefunction(getattr(registry, name)) for name in operations)
    assert operations == set(CALLS) - {"outbox_delete_nothing"} | {"aclose"}  # the test above calls every one
