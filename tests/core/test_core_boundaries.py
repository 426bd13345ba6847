"""Failure and cancellation boundaries. A drain cancelled at any of its checkpoints, a start whose outcome is
unknown, a registry that fails in a background task, a registry that answers slowly to the leader: none strands a job,
a slot or the truth. On a virtual clock, with the in-memory registry and executor (the real shepherd's case is in
``tests/execution/test_shepherd_stopped.py``)."""

from __future__ import annotations

import itertools
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from core_executors import PROGRAMS  # type: ignore[import-not-found]
from core_helpers import KINDS  # type: ignore[import-not-found]
from structlog.testing import capture_logs

from supervisor import (
    Config,
    JobStatus,
    Liveness,
    MemoryRegistry,
    RegistryError,
    RegistryUnavailable,
    Supervisor,
    SupervisorError,
    load_kinds,
)
from supervisor.core import Boot, Standing
from supervisor.execution.memory import MemoryExecutor
from supervisor.observe import EventBus
from supervisor.registry import Host, Lease

SLOTS = 3


@dataclass
class World:
    sup: Supervisor
    machine: MemoryExecutor
    registry: MemoryRegistry


@pytest.fixture
async def make_world(tmp_path: Path) -> AsyncIterator[Callable[..., World]]:
    """Supervisors on the in-memory registry and machine, driven by hand (no drainer task unless asked): the test is
    the only one that moves the queue."""
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    made = 0
    async with trio.open_nursery() as machines, trio.open_nursery() as nursery:

        def make(*, drainer: bool = False, max_concurrent: int = SLOTS) -> World:
            nonlocal made
            made += 1
            config = Config(
                data_dir=tmp_path / f"data-{made}",
                bind_port=0,
                kinds_file=kinds,
                max_concurrent=max_concurrent,
                sweep_interval_s=86400.0,
            )
            machine = MemoryExecutor(PROGRAMS, machines)
            registry = MemoryRegistry()
            sup = Supervisor(
                config, load_kinds(kinds), registry, boot_id=f"boot-{made}", executor=machine, standalone=True
            )
            sup.attach(nursery)
            if drainer:
                nursery.start_soon(sup.drainer.run)
            return World(sup, machine, registry)

        yield make
        nursery.cancel_scope.cancel()
        machines.cancel_scope.cancel()


class CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` right after the ``step``-th step of ``root`` and the tasks it started: the next checkpoint
    of whichever of them runs next raises ``Cancelled``. Counts every step, so a test can cancel at each in turn."""

    def __init__(self, scope: trio.CancelScope, step: int) -> None:
        self.scope = scope
        self.step = step
        self.steps = 0
        self.root: trio.lowlevel.Task | None = None

    def _ours(self, task: trio.lowlevel.Task) -> bool:
        while task is not None:
            if task is self.root:
                return True
            nursery = task.parent_nursery
            task = nursery.parent_task if nursery is not None else None  # type: ignore[assignment]
        return False

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.root is not None and self._ours(task):
            self.steps += 1
            if self.steps == self.step:
                self.scope.cancel()


async def _until(check: Callable[[], bool], *, steps: int = 100_000) -> None:
    """Until ``check()`` holds, looking every virtual 10 ms (a count, not a deadline: see ``_until_all_ended``)."""
    for _ in range(steps):
        if check():
            return
        await trio.sleep(0.01)  # virtual time: real work (worker threads) goes on meanwhile
    raise AssertionError("never")


async def _until_all_ended(world: World, ids: list[str], *, sweeps: int = 120) -> None:
    """Sweep (reconcile -> drain) every virtual second until every job ended: what the sweeper does. Bounded by a
    count of sweeps, not a deadline: the autojumping clock jumps to any pending deadline while a worker thread runs
    (the pause file's look, a log's write), which would end a deadline early."""
    for _ in range(sweeps):
        rows = [await world.sup.get(job_id) for job_id in ids]
        if all(row.status.is_terminal for row in rows):
            return
        await world.sup.sweeper.sweep()
        await trio.sleep(1)
    raise AssertionError(f"not ended after {sweeps} sweeps: {rows}")


async def _drain_cancelled_at(sup: Supervisor, step: int) -> bool:
    """``sup.drainer.drain()``, cancelled right after its ``step``-th step (its own tasks' steps counted); whether it
    was."""
    scope = trio.CancelScope()
    instrument = CancelAtStep(scope, step)

    async def drain(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        instrument.root = trio.lowlevel.current_task()
        task_status.started()
        with scope:
            await sup.drainer.drain()

    trio.lowlevel.add_instrument(instrument)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(drain)
    finally:
        trio.lowlevel.remove_instrument(instrument)
    return scope.cancel_called


async def test_a_drain_cancelled_at_any_checkpoint_leaves_each_promoted_row_started_queued_or_for_reconcile(
    autojump_clock: trio.testing.MockClock, make_world: Callable[..., World]
) -> None:
    """At every checkpoint of a drain in turn: once it is cancelled, no row stays held as "being
    started" by nobody; each promoted row is spawned and watched by a monitor, back in the queue, or running unheld
    for reconcile to judge -- and reconcile then judges every one, so that each job runs exactly once and succeeds
    (a start that never happened is not counted as an attempt)."""
    step = 0
    completed = False
    while not completed:
        step += 1
        assert step < 500, "the drain never completed"
        world = make_world()
        sup = world.sup
        ids = [(await sup.enqueue("sleep", {"seconds": 5})).job.job_id for _ in range(SLOTS)]
        completed = not await _drain_cancelled_at(sup, step)
        # The invariant, at once: nothing is held as a start any more, and whatever is watched has a monitor.
        assert not sup.boot.ledger.promotion_under_way(), step
        for job_id in ids:
            row = await sup.get(job_id)
            entry = sup.boot.ledger.entry(job_id)
            assert not sup.boot.ledger.being_started(job_id), (step, row)
            if entry is not None:
                assert entry.handle is not None and row.spawned, (step, row)
            # (A job the drain started and handed to its monitor may have run its course meanwhile: the clock jumps.)
            assert row.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED), (step, row)
        # Reconcile judges what the drain left; every job then runs once.
        await _until_all_ended(world, ids)
        rows = [await sup.get(job_id) for job_id in ids]
        assert [(r.status, r.attempts) for r in rows] == [(JobStatus.SUCCEEDED, 1)] * SLOTS, (step, rows)
        assert sorted(world.machine.started) == sorted(ids), (step, world.machine.started)
    assert step > 5  # the drain has checkpoints to cancel at: the test walked through them


class SecondLookHeld:
    """The drainer's pause-file look, held at its second call -- the look after the promotion's commit, before any
    start -- until ``go`` is set; the file is put in place first if ``appear``."""

    def __init__(self, sup: Supervisor, *, appear: bool) -> None:
        self.pause_file = sup.drainer.pause_file
        self.look = self.pause_file.look
        self.appear = appear
        self.calls = 0
        self.reached = trio.Event()
        self.go = trio.Event()

    async def __call__(self) -> bool:
        self.calls += 1
        if self.calls == 2:
            self.reached.set()
            await self.go.wait()
            if self.appear:
                self.pause_file.path.parent.mkdir(parents=True, exist_ok=True)
                self.pause_file.path.touch()
        return await self.look()


@pytest.mark.parametrize("appear", [False, True], ids=["starts", "pause-file-appeared"])
async def test_a_cancel_during_the_pause_files_second_look_is_carried_out_never_left_to_an_unverified_end(
    autojump_clock: trio.testing.MockClock, make_world: Callable[..., World], appear: bool
) -> None:
    """A cancel that reaches a row after its promotion's commit and while the drainer looks at the pause file again
    (a thread hop) finds the row held as a start: kept running, then stopped once started (``cancelled``), or, if the
    file appeared and the promotion is undone, ended ``cancelled_before_start`` without ever running. Before, it found
    the row unheld and ended it ``cancelled_unverified_process_left_alone`` while the drainer went on to start it."""
    world = make_world(max_concurrent=1)
    sup = world.sup
    job = (await sup.enqueue("sleep", {"seconds": 5})).job
    held = SecondLookHeld(sup, appear=appear)
    sup.drainer.pause_file.look = held  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.drainer.drain)
        await held.reached.wait()
        asked = await sup.cancel(job.job_id)
        assert (asked.status, asked.cancel_requested) == (JobStatus.RUNNING, True)  # kept: its start is under way
        assert sup.boot.ledger.being_started(job.job_id)
        held.go.set()
    await _until_all_ended(world, [job.job_id])
    final = await sup.get(job.job_id)
    if appear:
        assert (final.status, final.error_reason, final.attempts) == (JobStatus.CANCELLED, "cancelled_before_start", 0)
        assert world.machine.started == []
    else:
        assert (final.status, final.error_reason) == (JobStatus.CANCELLED, "cancelled")
        assert world.machine.started == [job.job_id]  # started, then stopped by its monitor
    assert not sup.boot.ledger.being_started(job.job_id)
    assert job.job_id not in sup.boot.ledger


async def test_a_cancel_between_the_promotions_commit_and_its_rows_being_held_is_carried_out_once_started(
    autojump_clock: trio.testing.MockClock, make_world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The promotion has committed (the row is running, of this boot) but the drainer has not yet taken its answer
    and held the rows: a cancel then leaves its request on the row instead of judging an unspawned row on evidence
    that cannot exist yet. The start carries it out: the job runs, is stopped, ends ``cancelled``."""
    world = make_world(max_concurrent=1)
    sup = world.sup
    job = (await sup.enqueue("sleep", {"seconds": 5})).job
    promote = world.registry.promote
    committed, go = trio.Event(), trio.Event()

    async def promote_then_wait(*args: Any, **kwargs: Any) -> Any:
        promotion = await promote(*args, **kwargs)
        committed.set()
        await go.wait()  # the drainer not scheduled yet: its answer still on its way back
        return promotion

    monkeypatch.setattr(world.registry, "promote", promote_then_wait)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.drainer.drain)
        await committed.wait()
        assert not sup.boot.ledger.being_started(job.job_id)  # not held yet
        asked = await sup.cancel(job.job_id)
        assert (asked.status, asked.cancel_requested) == (JobStatus.RUNNING, True)  # left on the row
        go.set()
    await _until_all_ended(world, [job.job_id])
    final = await sup.get(job.job_id)
    assert (final.status, final.error_reason, final.attempts) == (JobStatus.CANCELLED, "cancelled", 1)
    assert world.machine.started == [job.job_id]  # run once, stopped by its monitor


async def test_a_job_its_monitor_ends_while_reconcile_reads_the_rows_is_left_to_its_monitor_never_adopted(
    autojump_clock: trio.testing.MockClock,
    make_world: Callable[..., World],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Reconcile reads the running rows and asks the executor (alive); the job's monitor then finalizes it and lets
    go of it (before reconcile looks at ``watched``). The row reconcile holds says running and nobody watches it now:
    it must still count as watched -- its monitor is the authority on it -- and never be adopted (a second monitor, a
    ``job.adopted`` event after its end: seen once in the webhook test, which then waited for ever for the end as
    the last event)."""
    world = make_world(drainer=True)
    sup = world.sup
    job = (await sup.enqueue("gated", {"gate": str(tmp_path / "never"), "code": 0})).job  # runs until killed
    await _until(lambda: (entry := sup.boot.ledger.entry(job.job_id)) is not None and entry.handle is not None)
    evidence = sup.monitors.evidence

    async def evidence_then_the_job_ends(rows: Any) -> Any:
        found = await evidence(rows)
        assert [f.liveness for f in found] == [Liveness.ALIVE]
        world.machine.kill(job.job_id, signal.SIGKILL)  # it dies now...
        await _until(lambda: job.job_id not in sup.boot.ledger)  # ...its monitor finalizes it and lets go
        return found

    monkeypatch.setattr(sup.monitors, "evidence", evidence_then_the_job_ends)
    with capture_logs() as logs:
        report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert [e for e in logs if e["event"] == "job_adopted"] == []
    assert [(d.job_id, d.action, d.reason) for d in report.details] == [(job.job_id, "keep", "alive")]
    final = await sup.get(job.job_id)
    assert (final.status, final.error_reason, final.attempts) == (JobStatus.FAILED, "killed_by_SIGKILL", 1)
    assert job.job_id not in sup.boot.ledger  # no second monitor


async def test_a_stalled_job_its_monitor_ended_since_the_rows_were_read_is_no_warning_that_it_was_not_stopped(
    autojump_clock: trio.testing.MockClock, make_world: Callable[..., World], tmp_path: Path
) -> None:
    """The absence judge read the row (running, stalled: to be stopped); the job then ended and its monitor let go of
    it. Stopping it finds nobody watching and nothing alive: the row has ended, so there is nothing to stop and no
    ``stalled_job_not_terminated`` WARNING for an operator to chase (before: one, for a job that had ended)."""
    world = make_world(drainer=True)
    sup = world.sup
    job = (await sup.enqueue("gated", {"gate": str(tmp_path / "never"), "code": 0})).job
    await _until(lambda: (entry := sup.boot.ledger.entry(job.job_id)) is not None and entry.handle is not None)
    as_read = await sup.get(job.job_id)
    world.machine.kill(job.job_id, signal.SIGKILL)
    await _until(lambda: job.job_id not in sup.boot.ledger)
    with capture_logs() as logs:
        await sup.reconciler.stop_stalled(as_read)
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
    assert (await sup.get(job.job_id)).status is JobStatus.FAILED
    assert job.job_id not in sup.boot.ledger and sup.boot.ledger.stopping_for(job.job_id) is None


async def test_a_start_whose_outcome_is_unknown_is_kept_not_failed_and_adopted_once_it_runs(
    autojump_clock: trio.testing.MockClock, make_world: Callable[..., World]
) -> None:
    """The stopped shepherd, on the memory machine: a start is taken and not answered (SIGSTOP). After the start
    timeout its outcome is unknown: the row keeps its slot, running, never ``failed`` (before: ``spawn_failed``, its
    slot freed, and the job then ran anyway, unwatched). Released (SIGCONT), the machine starts it late; the next
    sweep finds it and adopts it; it ends ``succeeded``, run once."""
    world = make_world(drainer=True, max_concurrent=1)
    sup, machine = world.sup, world.machine
    machine.hold_starts()
    with capture_logs() as logs:
        job = (await sup.enqueue("sleep", {"seconds": 5})).job
        behind = (await sup.enqueue("sleep", {"seconds": 5})).job
        await _until(lambda: job.job_id in machine.pending_starts)  # asked: the machine holds it unanswered
        asked_at = trio.current_time()
        await _until(lambda: not sup.boot.ledger.being_started(job.job_id))  # given up on: nobody holds it now
    assert trio.current_time() - asked_at == pytest.approx(machine.start_timeout_s, abs=0.02)
    assert [e["why"] for e in logs if e["event"] == "job_start_unknown"] == ["the start was not answered in time"]
    row = await sup.get(job.job_id)
    assert (row.status, row.spawned, row.error_reason) == (JobStatus.RUNNING, False, None)
    assert not sup.boot.ledger.being_started(job.job_id)  # nobody holds it: reconcile's to judge
    judged = []
    for _ in range(5):  # INV-UNKNOWN-KEEPS-SLOT: sweeps keep it, and the job behind it waits
        report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
        judged += [(d.action, d.reason) for d in report.details]
        await sup.sweeper.sweep()
        await trio.sleep(10)
    # (A reconcile whose read overlapped one of the drainer's trial promotions leaves it for the next one.)
    assert set(judged) <= {("keep", "liveness_unknown_kept"), ("untouched", "spawn_window")}, judged
    assert ("keep", "liveness_unknown_kept") in judged
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING
    assert (await sup.get(behind.job_id)).status is JobStatus.QUEUED
    machine.release_starts()
    await trio.testing.wait_all_tasks_blocked()
    assert machine.started == [job.job_id]  # the late start happened on the machine
    await _until_all_ended(world, [job.job_id, behind.job_id])
    final = await sup.get(job.job_id)
    assert (final.status, final.attempts, final.history) == (JobStatus.SUCCEEDED, 1, ())
    assert machine.started == [job.job_id, behind.job_id]  # each once


async def test_a_start_whose_outcome_was_unknown_and_never_happened_goes_back_to_the_queue_uncounted(
    autojump_clock: trio.testing.MockClock, make_world: Callable[..., World]
) -> None:
    """The stopped shepherd killed before it acted on the start: the start provably never happened. The row goes back
    to the queue (``never_started``, not an attempt), never ``failed``; then it runs once."""
    world = make_world(drainer=True, max_concurrent=1)
    sup, machine = world.sup, world.machine
    machine.hold_starts()
    job = (await sup.enqueue("sleep", {"seconds": 5})).job
    await _until(lambda: job.job_id in machine.pending_starts)
    await _until(lambda: not sup.boot.ledger.being_started(job.job_id))
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING  # unknown: never failed
    machine.drop_starts()
    machine.release_starts()
    report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert [(d.action, d.reason) for d in report.details] == [("requeued", "never_started")]
    await _until_all_ended(world, [job.job_id])
    final = await sup.get(job.job_id)
    assert (final.status, final.attempts, final.history) == (JobStatus.SUCCEEDED, 1, ())
    assert machine.started == [job.job_id]


async def test_a_registry_that_cannot_record_the_starts_never_ends_the_supervisor(
    autojump_clock: trio.testing.MockClock, make_world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start task that meets an unavailable registry while it records the started jobs' identities goes on: the
    jobs get their monitors, which record their ends (the sweeps leave such a row to its monitor), once."""
    world = make_world(drainer=True)
    sup = world.sup
    real = world.registry.record_identities
    failures = 0

    async def failing(claims: Any) -> Any:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RegistryUnavailable("the registry's disk is full")
        return await real(claims)

    monkeypatch.setattr(world.registry, "record_identities", failing)
    job = (await sup.enqueue("sleep", {"seconds": 5})).job
    await _until(lambda: failures == 1)
    await _until_all_ended(world, [job.job_id])
    final = await sup.get(job.job_id)
    assert (final.status, final.attempts) == (JobStatus.SUCCEEDED, 1)
    assert world.machine.started == [job.job_id]


async def test_a_registry_that_fails_past_a_start_tasks_own_handling_meets_its_boundary_and_is_counted(
    autojump_clock: trio.testing.MockClock, make_world: Callable[..., World], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure the start task does not handle itself (the registry failing, not merely unavailable, as it records a
    spawn failure) meets the task's boundary: logged and counted (``job_start_failed``), the supervisor goes on, and
    the row it left is judged by the next sweep (it never started: back to the queue, then its true outcome)."""
    world = make_world(drainer=True)
    sup = world.sup
    real = world.registry.finalize
    failures = 0

    async def failing(job_id: str, ending: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RegistryError("the registry could not be written")
        return await real(job_id, ending, **kwargs)

    monkeypatch.setattr(world.registry, "finalize", failing)
    job = (await sup.enqueue("chatty", {"n": 1})).job  # no program on this machine: its start is refused
    await _until(lambda: failures == 1)
    await _until_all_ended(world, [job.job_id])
    final = await sup.get(job.job_id)
    assert (final.status, final.error_reason) == (JobStatus.FAILED, "spawn_failed: no program for kind 'chatty'")
    assert b'podcast_background_conditions_total{step="job_start_failed"} 1.0' in await sup.render_metrics()


async def test_a_bug_in_a_start_task_ends_the_supervisor(
    autojump_clock: trio.testing.MockClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Crash-only: what is not a condition is a bug, and a bug is not swallowed by a background task's boundary."""
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    config = Config(data_dir=tmp_path / "data", bind_port=0, kinds_file=kinds, sweep_interval_s=86400.0)
    registry = MemoryRegistry()

    raised = trio.Event()

    async def broken(claims: Any) -> Any:
        raised.set()
        raise KeyError("a bug")

    monkeypatch.setattr(registry, "record_identities", broken)
    with pytest.RaisesGroup(KeyError, flatten_subgroups=True):
        async with trio.open_nursery() as machines, trio.open_nursery() as nursery:
            machine = MemoryExecutor(PROGRAMS, machines)
            sup = Supervisor(config, load_kinds(kinds), registry, executor=machine, standalone=True)
            sup.attach(nursery)
            await nursery.start(sup.drainer.run)
            await sup.enqueue("sleep", {"seconds": 5})
            await raised.wait()
            with trio.move_on_after(3600):  # the bug ends the tree before this ends (nothing waits on a thread)
                await trio.sleep_forever()
            machines.cancel_scope.cancel()


async def test_the_gates_a_boot_carries_refuse_until_opened(tmp_path: Path) -> None:
    """May promote and leader duties default to refusing: a Supervisor whose fleet task has not renewed a
    lease (and that is not declared standalone) promotes nothing and leads nothing."""
    config = Config(data_dir=tmp_path / "data", bind_port=0)
    async with trio.open_nursery() as machines:
        machine = MemoryExecutor(PROGRAMS, machines)
        boot = Boot(
            config=config,
            kinds=load_kinds(None),
            registry=MemoryRegistry(),
            executor=machine,
            events=EventBus(),
            boot_id="b",
            data_dir=tmp_path,
            log_dir=tmp_path,
            standing=Standing(config.max_concurrent, standalone=False),
        )
        assert not boot.standing.may_promote() and not boot.standing.may_lead()
        sup = Supervisor(config, load_kinds(None), MemoryRegistry(), executor=machine)
        assert not sup.fleet.may_promote() and not sup.fleet.may_lead() and not sup.boot.standing.may_promote()
        assert not (await sup.health()).leader
        alone = Supervisor(config, load_kinds(None), MemoryRegistry(), executor=machine, standalone=True)
        assert alone.fleet.may_promote() and alone.fleet.may_lead()
        with pytest.raises(SupervisorError, match="standalone"):
            await alone.fleet.run()
        machines.cancel_scope.cancel()


class SlowRegistry(MemoryRegistry):
    """A registry on a busy database: a lease's renewal takes ``renew_s``, and each read of the leader's silent-host
    round (the running rows, the hosts) takes ``read_s``. ``renewals``: when each renewal was asked."""

    def __init__(self, renew_s: float, read_s: float) -> None:
        super().__init__()
        self.renew_s = renew_s
        self.read_s = read_s
        self.renewals: list[float] = []

    async def renew_lease(
        self, host_id: str, boot_id: str, *, lease_s: float, lead: bool, succeeds: str | None = None
    ) -> Lease:
        self.renewals.append(trio.current_time())
        await trio.sleep(self.renew_s)
        return await super().renew_lease(host_id, boot_id, lease_s=lease_s, lead=lead, succeeds=succeeds)

    async def hosts(self) -> list[Host]:
        await trio.sleep(self.read_s)
        return await super().hosts()

    async def running_jobs(self) -> list[Any]:
        await trio.sleep(self.read_s)
        return await super().running_jobs()


async def test_the_lease_renews_on_its_own_clock_however_slow_the_leaders_other_rounds(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """ADR 0014: the leader renewed, then ran its silent-host round (up to a third of the lease), then
    slept a third: with a renewal that takes half a period, two renewals' requests were 2.5 periods apart, past the
    2.4 a renewal keeps fresh, and a healthy leader stepped down and stopped promoting. Now the renewals keep their
    own period whatever the round does."""
    lease_s = 15.0
    period_s = lease_s / 3
    registry = SlowRegistry(renew_s=period_s / 2, read_s=period_s * 0.6)
    config = Config(data_dir=tmp_path / "data", bind_port=0, host_id="a", host_lease_s=lease_s)
    with capture_logs() as logs:
        async with trio.open_nursery() as machines, trio.open_nursery() as nursery:
            sup = Supervisor(config, load_kinds(None), registry, executor=MemoryExecutor(PROGRAMS, machines))
            await nursery.start(sup.fleet.run)
            start = trio.current_time()
            samples = []
            for _ in range(200):  # 20 periods, looked at ten times a period
                await trio.sleep(period_s / 10)
                samples.append((sup.fleet.leading, sup.fleet.may_promote()))
            nursery.cancel_scope.cancel()
            machines.cancel_scope.cancel()
    assert all(all(sample) for sample in samples), "the leader stepped down while every renewal succeeded"
    assert not [e for e in logs if e["event"] in ("fleet_leader_stepped_down", "host_lease_stale")]
    asked = [t - start for t in registry.renewals if t >= start]
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert len(gaps) >= 15 and max(gaps) == pytest.approx(period_s), gaps  # a fixed period, exact in virtual time
    # The leader's round still ran after each renewal (and was cut at a period: its two reads take 1.2 of one).
    assert any(e["event"] == "silent_hosts_round_cut_short" for e in logs)
