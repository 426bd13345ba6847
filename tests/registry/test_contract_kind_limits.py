"""The registry contract: a kind's max_running (INV-KIND-LIMIT-IS-A-COUNT), on every backend. The limit is a count
of the kind's RUNNING rows taken in the promotion's own step, like max_concurrent: never exceeded under concurrent
promotions from several hosts, and a full kind never holds up the rows of another kind queued behind it."""

from __future__ import annotations

import dataclasses
from collections import Counter

import trio
from registry_helpers import enqueue, request

from supervisor.domain import JobStatus
from supervisor.registry import Ending, Outcome, PromoteRequest, Registry

WAIT_S = 30.0  # a backstop for a broken test, never a timing assertion
SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)


def limited(max_concurrent: int, *tokens: str, host: str = "h1", **limits: int) -> PromoteRequest:
    return dataclasses.replace(request(max_concurrent, *tokens), host_id=host, kind_limits=limits)


async def running_kinds(registry: Registry) -> Counter[str]:
    return Counter(job.kind for job in await registry.running_jobs())


async def test_a_full_kind_is_passed_over_in_fifo_order_INV_KIND_LIMIT_IS_A_COUNT(registry: Registry) -> None:
    a = await enqueue(registry, 3, kind="a")
    b = await enqueue(registry, 2, kind="b", start=3)
    promotion = await registry.promote(limited(3, "t1", "t2", "t3", a=1))
    assert [job.job_id for job in promotion.jobs] == [a[0], *b]  # one a, then both b at once
    # The a's wait for the running one: a promotion with free slots and only a's ready promotes nothing.
    assert (await registry.promote(limited(5, "t4", a=1))).jobs == ()
    await registry.finalize(a[0], SUCCEEDED)
    assert [job.job_id for job in (await registry.promote(limited(5, "t5", "t6", a=1))).jobs] == [a[1]]


async def test_a_full_kind_never_holds_up_another_kind_deep_behind_it(registry: Registry) -> None:
    [first] = await enqueue(registry, 1, kind="a")
    await registry.promote(limited(2, "t0", a=1))
    await enqueue(registry, 60, kind="a", start=1)  # a long run of a full kind ...
    [b] = await enqueue(registry, 1, kind="b", start=61)  # ... and one row of another behind it
    promotion = await registry.promote(limited(2, "t1", "t2", a=1))
    assert [job.job_id for job in promotion.jobs] == [b]
    assert await running_kinds(registry) == Counter(a=1, b=1)
    assert first in {job.job_id for job in await registry.running_jobs()}


async def test_no_limit_is_every_kind_as_before(registry: Registry) -> None:
    ids = await enqueue(registry, 4, kind="a")
    assert [job.job_id for job in (await registry.promote(limited(3, "x", "y", "z"))).jobs] == ids[:3]


async def test_concurrent_promotions_from_two_hosts_never_exceed_a_kinds_limit_INV_KIND_LIMIT_IS_A_COUNT(
    registry: Registry,
) -> None:
    """Two hosts' drains promote and end rows at once; every read of the running rows has at most two a's, and
    every row runs once."""
    a = await enqueue(registry, 12, kind="a")
    b = await enqueue(registry, 6, kind="b", start=12)
    promoted: list[str] = []
    peak = 0

    async def drain(host: str, worker: int) -> None:
        nonlocal peak
        for attempt in range(10_000):
            promotion = await registry.promote(limited(4, f"{host}-{worker}-{attempt}", host=host, a=2))
            if not promotion.jobs:
                if (await registry.counts())["queued"] == 0:
                    return
                continue
            [job] = promotion.jobs
            promoted.append(job.job_id)
            kinds = await running_kinds(registry)
            assert kinds["a"] <= 2 and sum(kinds.values()) <= 4  # the others try to overshoot meanwhile
            peak = max(peak, kinds["a"])
            await registry.finalize(job.job_id, SUCCEEDED)
        raise AssertionError("a drain never finished")

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            for worker in range(3):
                nursery.start_soon(drain, "h1", worker)
                nursery.start_soon(drain, "h2", worker)
    assert sorted(promoted) == sorted(a + b) and peak >= 1


async def test_the_reads_see_each_kinds_load_and_pass_over_a_full_kinds_rows(registry: Registry) -> None:
    a = await enqueue(registry, 2, kind="a")
    b = await enqueue(registry, 1, kind="b", start=2)
    await registry.promote(limited(1, "t1"))  # a[0] runs
    assert await registry.kind_counts() == {"a": (1, 1), "b": (0, 1)}
    assert (await registry.oldest_waiting()).job_id == a[1]  # type: ignore[union-attr]
    assert (await registry.oldest_waiting({"a": 1})).job_id == b[0]  # type: ignore[union-attr]
    assert await registry.oldest_waiting({"a": 1, "b": 0}) is None
