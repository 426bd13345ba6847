"""The registry contract: the job list's filters (``JobFilter``: reason, a declared param's value, creation and end
times, host), each alone and combined, with paging, on every backend."""

from __future__ import annotations

import dataclasses

from registry_helpers import EPOCH, WallClock, request

from supervisor.domain import JobFilter, JobStatus, PageRequest, Schedule
from supervisor.registry import Ending, NewJob, Outcome, Registry

UNAVAILABLE = Ending(Outcome(JobStatus.FAILED, "all_feeds_unavailable"), exit_code=75)
FAILED = Ending(Outcome(JobStatus.FAILED, "exit_code_1"), exit_code=1)


async def add(reg: Registry, feed: str, n: int, *, urgent: bool = False) -> str:
    params = {"feed": feed, "n": n, "urgent": urgent, "ratio": n / 2}
    return (await reg.enqueue(NewJob("pipeline", params, ["run", feed]))).job.job_id


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
