"""The registry contract: the job list's filters (``JobFilter``: reason, a declared param's value, creation and end
times, host), each alone and combined, with paging, on every backend."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest
from registry_helpers import EPOCH, WallClock, request

from supervisor.domain import (
    FILTER_TIME_RANGE,
    INT64_MAX,
    INT64_MIN,
    JobFilter,
    JobStatus,
    PageRequest,
    Schedule,
    ValidationError,
)
from supervisor.registry import Ending, NewJob, Outcome, Registry

UNAVAILABLE = Ending(Outcome(JobStatus.FAILED, "all_feeds_unavailable"), exit_code=75)
FAILED = Ending(Outcome(JobStatus.FAILED, "exit_code_1"), exit_code=1)


async def add(reg: Registry, feed: str, n: int, *, urgent: bool = False) -> str:
    params = {"feed": feed, "n": n, "urgent": urgent, "ratio": n / 2}
    return (await reg.enqueue(NewJob("pipeline", params, ["run", feed]))).job.job_id


async def add_params(reg: Registry, params: dict[str, float | int]) -> str:
    return (await reg.enqueue(NewJob("pipeline", params, ["run"]))).job.job_id


async def ids(reg: Registry, wanted: JobFilter, limit: int = 100) -> list[str]:
    """Every matching row's id, newest first, read page by page (``limit`` rows a page)."""
    out: list[str] = []
    page = PageRequest(wanted, limit)
    while True:
        jobs, cursor = await reg.list_jobs(page)
        out += [job.job_id for job in jobs]
        if cursor is None:
            return out
        page = PageRequest(wanted, limit, int(cursor))


async def test_every_filter_alone_and_combined_with_paging(registry: Registry, clock: WallClock) -> None:
    a1 = await add(registry, "https://a.example/", 1)
    a2 = await add(registry, "https://a.example/", 2, urgent=True)
    clock.advance(3600)
    b1 = await add(registry, "https://b.example/", 1)
    a3 = await add(registry, "https://a.example/", 3)
    # a1 and b1 run on host h1 and end: a1 with the outage's reason, b1 with another; a2 on h2, still running.
    # FIFO promotes the oldest first: a1 on h1, then a2 on h2.
    await registry.promote(dataclasses.replace(request(4, "t-a1"), host_id="h1"))
    await registry.promote(dataclasses.replace(request(4, "t-a2"), host_id="h2"))
    assert {job.job_id for job in await registry.running_jobs()} == {a1, a2}
    await registry.finalize(a1, UNAVAILABLE)
    clock.advance(60)
    ended_late = clock.now
    [b_promoted] = (await registry.promote(dataclasses.replace(request(4, "t-b"), host_id="h1"))).jobs
    assert b_promoted.job_id == b1
    await registry.finalize(b1, FAILED)

    assert await ids(registry, JobFilter(reason="all_feeds_unavailable")) == [a1]
    assert await ids(registry, JobFilter(params=(("feed", "https://a.example/"),))) == [a3, a2, a1]
    assert await ids(registry, JobFilter(params=(("feed", "https://a.example/"),)), limit=1) == [a3, a2, a1]
    assert await ids(registry, JobFilter(params=(("n", 1),))) == [b1, a1]  # an int, not the text "1"
    assert await ids(registry, JobFilter(params=(("urgent", True),))) == [a2]
    assert await ids(registry, JobFilter(params=(("ratio", 1.5),))) == [a3]
    assert await ids(registry, JobFilter(params=(("n", 1), ("feed", "https://a.example/")))) == [a1]
    assert await ids(registry, JobFilter(created_since=EPOCH)) == [a3, b1, a2, a1]
    hour = (await registry.get(b1)).created_at
    assert await ids(registry, JobFilter(created_since=hour)) == [a3, b1]
    assert await ids(registry, JobFilter(created_until=hour)) == [a2, a1]
    assert await ids(registry, JobFilter(ended_since=ended_late)) == [b1]
    assert await ids(registry, JobFilter(host="h1")) == [b1, a1]
    assert await ids(registry, JobFilter(host="h1", status=JobStatus.FAILED, created_since=hour)) == [b1]
    assert await ids(registry, JobFilter(status=JobStatus.QUEUED, params=(("feed", "https://a.example/"),))) == [a3]
    assert await ids(registry, JobFilter(kind="enrichment")) == []


async def test_a_selections_ids_and_its_expiry(registry: Registry, clock: WallClock) -> None:
    first = await add(registry, "https://a.example/", 1)
    second = await add(registry, "https://a.example/", 2)
    assert await registry.select_ids(JobFilter(params=(("feed", "https://a.example/"),)), 10) == [second, first]
    assert await registry.select_ids(JobFilter(), 1) == [second]
    await registry.record_setting("bulk/old", "{}", "h1", replace=False)
    clock.advance(10)
    await registry.record_setting("bulk/new", "{}", "h1", replace=False)
    await registry.record_setting("max_concurrent", "3", "h1", replace=False)
    assert await registry.drop_settings("bulk/", clock.now) == 1  # only bulk/old was recorded before now
    assert await registry.setting("bulk/old") is None
    assert await registry.setting("bulk/new") is not None and await registry.setting("max_concurrent") is not None


async def test_an_if_idle_tick_is_skipped_while_its_schedules_job_is_queued_or_running(registry: Registry) -> None:
    hourly = Schedule("feed-a", 3600.0, if_idle=True)
    first = await registry.enqueue(NewJob("pipeline", {"feed": "a"}, ["run"], schedule=hourly))
    assert (first.job.schedule, first.job.schedule_every_s, first.skipped) == ("feed-a", 3600.0, False)
    skipped = await registry.enqueue(NewJob("pipeline", {"feed": "a"}, ["run"], schedule=hourly))
    assert (skipped.skipped, skipped.job.job_id) == (True, first.job.job_id)  # nothing written
    feed_b = Schedule("feed-b", 3600.0, if_idle=True)
    other = await registry.enqueue(NewJob("pipeline", {"feed": "b"}, ["run"], schedule=feed_b))
    assert not other.skipped  # another schedule is its own
    await registry.request_cancel(first.job.job_id)  # the queued one ends
    again = await registry.enqueue(NewJob("pipeline", {"feed": "a"}, ["run"], schedule=hourly))
    assert not again.skipped and again.job.job_id != first.job.job_id
    assert len(await ids(registry, JobFilter(kind="pipeline"))) == 3


async def test_a_number_param_is_compared_as_a_number_whatever_its_spelling(registry: Registry) -> None:
    # PostgreSQL keeps a JSON number in its own spelling (0.00001, 10000000000000000): a comparison of texts missed
    # these rows there, and a float param stored as a whole number (2) missed 2.0 in memory.
    ratios: list[float | int] = [1e-05, 1e-07, 1e16, 0.1, 2, 2.5e-300]
    by_ratio = {ratio: await add_params(registry, {"ratio": ratio, "n": i}) for i, ratio in enumerate(ratios)}
    for ratio, job_id in by_ratio.items():
        assert await ids(registry, JobFilter(params=(("ratio", float(ratio)),))) == [job_id], ratio
    assert await ids(registry, JobFilter(params=(("ratio", 0.00001),))) == [by_ratio[1e-05]]
    assert await ids(registry, JobFilter(params=(("ratio", 1e-06),))) == []
    assert await ids(registry, JobFilter(params=(("n", 1.0),))) == [by_ratio[1e-07]]  # an int param, as a number


async def test_an_int_param_at_the_ends_of_64_bits_and_beyond(registry: Registry) -> None:
    ends = [INT64_MIN, INT64_MAX, 2**53 + 1, -(2**53) - 1]
    by_n = {n: await add_params(registry, {"n": n}) for n in ends}
    for n, job_id in by_n.items():
        assert await ids(registry, JobFilter(params=(("n", n),))) == [job_id], n
    assert await ids(registry, JobFilter(params=(("n", 2**53),))) == []  # not the float's neighbour
    # Beyond 64 bits no registry is asked (SQLite cannot bind it): the filter cannot be built, naming the param.
    for beyond in (INT64_MAX + 1, INT64_MIN - 1):
        with pytest.raises(ValidationError) as refused:
            await ids(registry, JobFilter(params=(("n", beyond),)))
        assert refused.value.field == "param.n"
    assert await registry.select_ids(JobFilter(params=(("n", INT64_MAX),)), 10) == [by_n[INT64_MAX]]


async def test_a_time_filter_at_the_ends_of_the_calendar(registry: Registry, clock: WallClock) -> None:
    first = await add(registry, "https://a.example/", 1)
    earliest, latest = FILTER_TIME_RANGE
    assert await ids(registry, JobFilter(created_since=earliest)) == [first]
    assert await ids(registry, JobFilter(created_until=latest)) == [first]
    assert await ids(registry, JobFilter(created_since=latest)) == []
    assert await ids(registry, JobFilter(created_until=earliest)) == []
    assert await ids(registry, JobFilter(ended_since=earliest)) == []  # it has not ended
    assert await registry.select_ids(JobFilter(created_since=earliest, created_until=latest), 10) == [first]
    # A time whose move to UTC leaves the calendar cannot be built, naming the wire's field.
    beyond = {
        "since": {"created_since": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1)))},
        "until": {"created_until": datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1)))},
        "ended_since": {"ended_since": datetime(1, 1, 1, 0, 59, tzinfo=timezone(timedelta(hours=1)))},
    }
    for field, given in beyond.items():
        with pytest.raises(ValidationError) as refused:
            await ids(registry, JobFilter(**given))
        assert refused.value.field == field


async def test_a_time_filter_over_a_wide_history_whose_clock_stepped_back(registry: Registry, clock: WallClock) -> None:
    """More rows than a narrow range holds (SQLite reads a narrow one from its index, walks a wide one down seq, from
    the range's own newest row when it ends before the newest): every range answers exactly the rows in it, newest
    first, page by page, though the creation times are not in seq order (the clock stepped back 400 s)."""
    made: list[tuple[str, datetime]] = []  # (job id, created at), in insertion (seq) order
    for step_back in (0, 400):
        clock.advance(-step_back)
        for _ in range(60):  # 20 rows every 10 s: 1,200 rows, then 1,200 more from 400 s before the last
            clock.advance(10)
            results = await registry.enqueue_many([NewJob("pipeline", {}, ["run"])] * 20)
            made += [(r.job.job_id, r.job.created_at) for r in results]
    start = EPOCH
    at = [start + timedelta(seconds=s) for s in (0, 100, 250, 500, 700, 799, 900)]
    ranges = [
        JobFilter(created_since=at[0]),  # every row
        JobFilter(created_since=at[5]),  # the newest row only
        JobFilter(created_until=at[6]),  # every row
        JobFilter(created_until=at[4]),  # 2,180 rows, ending before the newest
        JobFilter(created_until=at[1]),  # the first 180
        JobFilter(created_since=at[2], created_until=at[4]),  # 1,600 rows in two runs far apart in seq
        JobFilter(created_since=at[3], created_until=at[4]),  # 620 rows in two runs
        JobFilter(created_since=at[6]),  # none
    ]
    for wanted in ranges:
        low, high = wanted.created_since, wanted.created_until
        expected = [
            job_id
            for job_id, created in reversed(made)
            if (low is None or created >= low) and (high is None or created < high)
        ]
        assert await ids(registry, wanted) == expected, wanted
        assert await registry.select_ids(wanted, 1000) == expected[:1000], wanted
