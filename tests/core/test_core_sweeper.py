"""The sweeper on a virtual clock: startup sweep at once, then every interval; failures never end the loop."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import trio
import trio.testing
from core_helpers import dead_identity, insert_running, wait_terminal  # type: ignore[import-not-found]

from supervisor import ExecutorUnavailable, JobStatus, RegistryError, RegistryUnavailable, Supervisor
from supervisor.core import ReconcileReport, Tally, run_sweeper


class FakeTarget:
    def __init__(self, fail_on: set[int] | None = None, error: Exception | None = None) -> None:
        self.times: list[float] = []
        self.fail_on = fail_on or set()
        self.error = error or RegistryUnavailable("the registry's disk is full")

    async def sweep(self) -> None:
        self.times.append(trio.current_time())
        if len(self.times) in self.fail_on:
            raise self.error


async def test_startup_sweep_runs_before_started_then_every_interval(autojump_clock: trio.testing.MockClock) -> None:
    target = FakeTarget()
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(run_sweeper, target, 30.0)
        assert target.times == [start]  # the startup sweep is done before start() returns
        await trio.sleep(95)
        nursery.cancel_scope.cancel()
    assert [t - start for t in target.times] == [0, 30, 60, 90]


@pytest.mark.parametrize(
    "error", [RegistryUnavailable("disk full"), ExecutorUnavailable("engine down"), OSError(28, "No space left")]
)
async def test_a_condition_in_a_sweep_does_not_stop_the_loop_and_is_counted(
    autojump_clock: trio.testing.MockClock, error: Exception
) -> None:
    """The sweeper's error boundary (ADR 0014): the registry, the engine or a disk failing is a condition: logged,
    counted, and the next sweep runs on time."""
    target = FakeTarget(fail_on={1, 2}, error=error)
    tally = Tally()
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(functools.partial(run_sweeper, target, 10.0, tally=tally))
        await trio.sleep(35)
        nursery.cancel_scope.cancel()
    assert [t - start for t in target.times] == [0, 10, 20, 30]
    assert tally.counts == {"sweep_failed": 2}


async def test_a_bug_in_a_sweep_ends_the_sweeper_and_with_it_the_supervisor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Crash-only (ADR 0014): a bug is not a condition to log and go on with; it ends the nursery tree (systemd
    restarts the supervisor; the next boot adopts its jobs)."""
    target = FakeTarget(fail_on={2}, error=RuntimeError("a bug"))
    start = trio.current_time()
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="a bug")):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_sweeper, target, 10.0)
            await trio.sleep(35)
    assert [t - start for t in target.times] == [0, 10]


async def test_sweep_order_is_reconcile_then_drain_and_reconcile_failure_still_drains(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = make_supervisor()
    calls: list[str] = []

    async def reconcile(*, stale_marks_live_processes: bool) -> ReconcileReport:
        calls.append(f"reconcile(stale_marks_live_processes={stale_marks_live_processes})")
        if "fail" in calls:
            raise RegistryError("the registry could not be read")
        return ReconcileReport(0, [])

    async def drain() -> list[object]:
        calls.append("drain")
        return []

    monkeypatch.setattr(sup.reconciler, "reconcile", reconcile)
    monkeypatch.setattr(sup.drainer, "drain", drain)
    await sup.sweeper.sweep()
    assert calls == ["reconcile(stale_marks_live_processes=False)", "drain"]
    calls[:] = ["fail"]
    await sup.sweeper.sweep()
    assert calls[-1] == "drain"


async def test_pause_holds_promotion_but_not_reconcile(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(boot_id="new")
    dead = await dead_identity()
    ghost = await insert_running(sup, boot_id="old", identity=dead)
    await sup.pause()
    waiting = (await sup.enqueue("exit", {"code": 0})).job
    await sup.sweeper.sweep()
    assert (await sup.get(ghost.job_id)).error_reason == "orphan_reconciled_dead_pid"
    assert (await sup.get(waiting.job_id)).status is JobStatus.QUEUED
    await sup.resume()
    assert (await sup.get(waiting.job_id)).status is not JobStatus.QUEUED
    assert (await wait_terminal(sup, waiting.job_id)).status is JobStatus.SUCCEEDED
