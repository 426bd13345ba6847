"""The core's rules against the in-memory executor: what an unreachable engine, a lost job or a slow stop mean for
slots and outcomes, checked in milliseconds (and on a virtual clock where time is the point)."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
import trio
import trio.testing
from core_executors import PROGRAMS  # type: ignore[import-not-found]
from core_helpers import (  # type: ignore[import-not-found]
    count_promote_rounds,
    enqueue_raw,
    insert_running,
    poll,
    wait_running,
    wait_status,
    wait_terminal,
)
from structlog.testing import capture_logs

from supervisor import Config, ExitStatus, Job, JobStatus, SpawnError, Supervisor
from supervisor.core import ending, outcome
from supervisor.domain import IdentityRecord
from supervisor.execution import Launch
from supervisor.execution.memory import MemoryExecutor, MemoryHandle
from supervisor.registry import IdentityClaim, Outcome


@pytest.fixture
def machine(nursery: trio.Nursery) -> MemoryExecutor:
    return MemoryExecutor(PROGRAMS, nursery)


@pytest.fixture
def make(make_supervisor: Callable[..., Supervisor], machine: MemoryExecutor) -> Callable[..., Supervisor]:
    def make_(**kwargs: object) -> Supervisor:
        return make_supervisor(executor=lambda config: machine, **kwargs)

    return make_


async def test_an_unreachable_engine_keeps_slots_holds_the_queue_and_fails_nothing_INV_UNKNOWN_KEEPS_SLOT(
    make: Callable[..., Supervisor], machine: MemoryExecutor
) -> None:
    sup = make(max_concurrent=1, sweep_interval_s=3600)
    gate = sup.data_dir / "gate"
    job = await wait_running(sup, (await sup.enqueue("gated", {"gate": str(gate), "code": 4})).job.job_id)
    machine.unreachable()
    queued = (await sup.enqueue("exit", {"code": 0})).job
    with capture_logs() as logs:
        report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
        for _ in range(3):
            await sup.drainer.drain()
    [detail] = report.details
    # This boot's monitor watches it: reconcile leaves it to the monitor (which waits for the engine).
    assert (detail.action, detail.liveness) == ("keep", "unknown")
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING
    assert (await sup.get(queued.job_id)).status is JobStatus.QUEUED
    held = [e for e in logs if e["event"] == "drain_held"]
    # Said once, not once per drain; INFO: the executor's engine WARNING is the episode's (docker mode).
    assert len(held) == 1 and held[0]["log_level"] == "info"

    await trio.to_thread.run_sync(gate.write_text, "open")  # it ends while the engine cannot be asked
    await poll(lambda: _ended(machine, job.job_id))
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING  # nobody can know how yet: still running
    with capture_logs() as logs:
        machine.reachable()
        ended = await wait_terminal(sup, job.job_id)
        assert (ended.status, ended.error_reason, ended.exit_code) == (JobStatus.FAILED, "exit_code_4", 4)
        assert (await wait_terminal(sup, queued.job_id)).status is JobStatus.SUCCEEDED
    assert any(e["event"] == "drain_resumed" for e in logs)


async def _ended(machine: MemoryExecutor, job_id: str) -> bool | None:
    await trio.lowlevel.checkpoint()
    return machine.jobs[job_id].status is not None or None


async def test_a_prior_boots_row_is_kept_while_the_engine_cannot_be_asked(
    make: Callable[..., Supervisor], machine: MemoryExecutor
) -> None:
    sup = make(boot_id="new", attach=False)
    never_recorded = await insert_running(sup, boot_id="old", spawned=False)
    recorded = await insert_running(sup, boot_id="old", spawned=False)
    record = IdentityRecord("memory", {"container_id": "memory-gone"})
    await sup.registry.record_identities([IdentityClaim(recorded.job_id, record)])
    machine.unreachable()
    with capture_logs() as logs:
        report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    # INV-UNKNOWN-KEEPS-SLOT: not even a row with no container recorded is freed when the engine cannot say
    # whether one was made for it.
    kept = ("keep", "liveness_unknown_kept", "unknown")
    assert [(d.action, d.reason, d.liveness) for d in report.details] == [kept, kept]
    warnings = [e for e in logs if e["event"] == "reconcile_kept_slot"]
    assert len(warnings) == 2 and warnings[0]["detail"] == "engine unreachable"
    machine.reachable()
    await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert (await sup.get(never_recorded.job_id)).status is JobStatus.QUEUED  # it never started: queued again
    assert (await sup.get(recorded.job_id)).error_reason == "orphan_reconciled_dead_pid"


async def test_a_job_gone_with_no_record_is_the_modes_orphan_never_a_guess(
    make: Callable[..., Supervisor], machine: MemoryExecutor
) -> None:
    sup = make()
    job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    machine.lose(job.job_id)
    ended = await wait_terminal(sup, job.job_id)
    assert (ended.status, ended.error_reason, ended.exit_code) == (JobStatus.FAILED, "orphan_reconciled_dead_pid", None)


@pytest.fixture
def inline_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run blocking calls (the registry's) inline: on a virtual clock that jumps whenever every task waits, a call
    in a worker thread would let the clock run ahead of real work."""

    async def inline(fn: Callable[..., object], *args: object, **_: object) -> object:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    monkeypatch.setattr(trio.to_thread, "run_sync", inline)


async def test_cancel_escalates_to_sigkill_exactly_after_the_grace_period(
    make: Callable[..., Supervisor],
    machine: MemoryExecutor,
    inline_threads: None,
    autojump_clock: trio.testing.MockClock,
) -> None:
    sup = make(cancel_grace_s=30.0)
    job = await wait_running(sup, (await sup.enqueue("term_ignorer", {})).job.job_id)
    await sup.cancel(job.job_id)
    cancelled_at = trio.current_time()
    await trio.sleep(29)
    assert machine.jobs[job.job_id].terminated.is_set()  # SIGTERM went out at once ...
    assert machine.jobs[job.job_id].status is None  # ... was ignored, and the grace period is not over
    await machine.jobs[job.job_id].ended.wait()
    assert trio.current_time() - cancelled_at == pytest.approx(30)  # SIGKILL at the end of the grace, not before
    ended = await wait_status(sup, job.job_id, {JobStatus.CANCELLED})
    assert (ended.error_reason, ended.exit_code) == ("cancelled", -9)


def test_dockers_128_plus_n_stays_an_exit_code_and_only_the_oom_killer_is_named() -> None:
    """Docker reports a job killed by signal N as exit 128 + N, like a program exiting 128 + N: the number is kept
    as the engine gave it. Only the engine's own OOMKilled flag names a cause."""
    assert outcome(ExitStatus(code=137), exit_reasons={}) == Outcome(JobStatus.FAILED, "exit_code_137")
    assert outcome(ExitStatus(code=137, oom_killed=True), exit_reasons={}) == Outcome(
        JobStatus.FAILED, "killed_out_of_memory"
    )
    assert outcome(ExitStatus(signal=9), exit_reasons={}) == Outcome(JobStatus.FAILED, "killed_by_SIGKILL")
    # A cancel wins over how the stopped job ended.
    cancelled = ending(ExitStatus(code=137, oom_killed=True), kind=None, cancel_asked=True, stop=None,
                       orphan_reason="orphan_reconciled_no_container")
    assert cancelled.chosen(cancel_requested=False) == Outcome(JobStatus.CANCELLED, "cancelled")


def test_the_exec_mode_is_listed_once_and_every_mode_has_an_executor() -> None:
    from supervisor.api import openapi_document
    from supervisor.domain import EXEC_MODES, load_kinds
    from supervisor.execution import create_executor

    for mode in EXEC_MODES:
        executor = create_executor(Config(exec_mode=mode), base_env={})
        assert executor.mode == mode
    health = openapi_document(load_kinds(None))["components"]["schemas"]["Health"]
    assert health["properties"]["exec_mode"]["enum"] == list(EXEC_MODES)


async def test_a_drain_cancelled_mid_start_leaves_no_job_looking_watched(
    make: Callable[..., Supervisor], nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shutdown that cancels a drain while it starts a job must not leave the job marked as watched by this boot:
    a later cancel would wait for a monitor that does not exist, and the row would never end."""
    sup = make(attach=False)
    sup.attach(nursery)  # no drainer task: the only drain is the one this test cancels
    entered = trio.Event()

    async def stuck_start(job: Job, token: str) -> object:
        entered.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(sup.drainer, "_start", stuck_start)
    job = (await sup.enqueue("sleep", {"seconds": 60})).job
    async with trio.open_nursery() as shutdown:
        shutdown.start_soon(sup.drainer.drain)
        await entered.wait()
        shutdown.cancel_scope.cancel()
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING  # promoted, never started
    row = await sup.cancel(job.job_id)
    assert (row.status, row.error_reason) == (JobStatus.CANCELLED, "cancelled_unverified_process_left_alone")


async def test_cancel_of_a_prior_boots_job_waits_for_the_engine_and_never_frees_the_slot_INV_UNKNOWN_KEEPS_SLOT(
    make: Callable[..., Supervisor], machine: MemoryExecutor
) -> None:
    """An operator cancels a previous boot's job while the engine does not answer: nothing can be stopped and the job
    may run on, so the row keeps its slot with the cancel requested; the sweep that reaches the engine stops it."""
    async with trio.open_nursery() as old_boot:
        old = make(boot_id="old", max_concurrent=1, attach=old_boot)
        job = await wait_running(old, (await old.enqueue("sleep", {"seconds": 60})).job.job_id)
        old_boot.cancel_scope.cancel()  # the old boot dies; its job runs on
    new = make(boot_id="new", max_concurrent=1, cancel_grace_s=0.1, sweep_interval_s=3600)
    machine.unreachable()
    with capture_logs() as logs:
        row = await new.cancel(job.job_id)
    assert (row.status, row.cancel_requested) == (JobStatus.RUNNING, True)
    assert machine.jobs[job.job_id].status is None  # nothing was (or could be) stopped
    [warning] = [e for e in logs if e["event"] == "cancel_pending_engine_unreachable"]
    assert warning["log_level"] == "warning"
    queued = (await new.enqueue("exit", {"code": 0})).job
    await new.sweeper.sweep()
    # The slot is still the running job's: nothing else was started past max_concurrent.
    assert (await new.get(queued.job_id)).status is JobStatus.QUEUED
    assert machine.started == [job.job_id]

    machine.reachable()
    await new.sweeper.sweep()  # adopts the job with its pending cancel, and stops it
    ended = await wait_terminal(new, job.job_id)
    assert (ended.status, ended.error_reason) == (JobStatus.CANCELLED, "cancelled")
    assert machine.jobs[job.job_id].terminated.is_set()
    assert (await wait_terminal(new, queued.job_id)).status is JobStatus.SUCCEEDED


async def test_a_drain_that_fills_the_free_slots_reads_the_queue_once(
    make: Callable[..., Supervisor], nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer rows promoted than asked means the slots are full or the queue is empty: no second promote round.
    A failed start frees its slot, so that drain goes on and fills it."""
    sup = make(max_concurrent=2, attach=False)
    sup.attach(nursery)  # no drainer task: only the drains this test runs
    calls = count_promote_rounds(sup, monkeypatch)
    sleep_argv = sup.kinds.get("sleep").render_argv({"seconds": 60})
    ids = [(await enqueue_raw(sup, "sleep", {"i": i}, sleep_argv)).job_id for i in range(3)]
    started = await sup.drainer.drain()
    assert [j.job_id for j in started] == ids[:2]
    assert calls == [2]  # two slots, two rows: full, and no round that only reads that again

    for job_id in ids:
        await sup.cancel(job_id)
    for job_id in ids:
        await wait_terminal(sup, job_id)
    calls.clear()
    # A start that fails (no program for the kind) frees its slot at once: the same drain promotes again.
    broken = await enqueue_raw(sup, "no_such_program", {}, ["x"])
    good = [(await enqueue_raw(sup, "sleep", {"j": j}, sleep_argv)).job_id for j in (1, 2)]
    started = await sup.drainer.drain()
    assert [j.job_id for j in started] == good
    assert (await sup.get(broken.job_id)).status is JobStatus.FAILED
    assert calls == [2, 1]


class _SlowStarts(MemoryExecutor):
    """A machine whose start of the jobs in ``held`` waits until ``go`` is set."""

    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__(PROGRAMS, nursery)
        self.held: set[str] = set()
        self.go = trio.Event()

    async def start(self, launch: Launch) -> MemoryHandle:
        if launch.job_id in self.held:
            await self.go.wait()
        return await super().start(launch)


async def test_a_slow_start_never_holds_back_the_next_jobs_start(
    make_supervisor: Callable[..., Supervisor], nursery: trio.Nursery
) -> None:
    # Promotion latency (ADR 0004): jobs a job's end promoted are started by the drainer; one start waiting on its
    # executor must not keep the next ending job's successor waiting behind it.
    machine = _SlowStarts(nursery)
    sup = make_supervisor(executor=lambda config: machine, max_concurrent=2, sweep_interval_s=3600)
    gates = [sup.data_dir / "gate-1", sup.data_dir / "gate-2"]
    first, second = [
        await wait_running(sup, (await sup.enqueue("gated", {"gate": str(g), "code": 0})).job.job_id) for g in gates
    ]
    slow = (await sup.enqueue("exit", {"code": 0})).job
    fast = (await sup.enqueue("exit", {"code": 0})).job
    machine.held.add(slow.job_id)
    await trio.to_thread.run_sync(gates[0].write_text, "open")  # first ends: slow is promoted, its start waits
    await wait_terminal(sup, first.job_id)
    await trio.to_thread.run_sync(gates[1].write_text, "open")  # second ends: fast is promoted and starts
    assert (await wait_terminal(sup, fast.job_id, timeout_s=10)).status is JobStatus.SUCCEEDED
    assert (await wait_terminal(sup, second.job_id)).status is JobStatus.SUCCEEDED
    assert (await sup.get(slow.job_id)).status is JobStatus.RUNNING and slow.job_id not in machine.started
    machine.go.set()
    assert (await wait_terminal(sup, slow.job_id)).status is JobStatus.SUCCEEDED
    assert machine.started.count(slow.job_id) == 1  # started once


async def test_a_stop_that_fails_is_logged_and_the_monitor_still_finalizes_the_job_when_it_ends(
    make: Callable[..., Supervisor],
    machine: MemoryExecutor,
    inline_threads: None,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stop runs in a task of its own, started by the cancel: its failure must neither end the monitor (the
    job would be left unwatched) nor reach the job nursery (it would take the supervisor down)."""
    sup = make(max_concurrent=1)
    job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    queued = (await sup.enqueue("exit", {"code": 0})).job

    async def broken_stop(handle: MemoryHandle, grace_s: float) -> None:
        raise SpawnError("the engine refused the stop")

    monkeypatch.setattr(machine, "stop", broken_stop)
    with capture_logs() as logs:
        assert (await sup.cancel(job.job_id)).cancel_requested
        await trio.sleep(1)
    assert [e["job_id"] for e in logs if e["event"] == "job_stop_failed"] == [job.job_id]
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING  # still watched, slot still held
    assert (await sup.get(queued.job_id)).status is JobStatus.QUEUED
    machine.kill(job.job_id, signal.SIGTERM)  # the job ends by other means: its monitor finalizes it
    ended = await wait_status(sup, job.job_id, {JobStatus.CANCELLED})
    assert (ended.error_reason, ended.exit_code) == ("cancelled", -15)
    assert (await wait_terminal(sup, queued.job_id)).status is JobStatus.SUCCEEDED


async def test_a_job_that_ends_on_sigterm_gets_no_sigkill_after_the_grace(
    make: Callable[..., Supervisor],
    machine: MemoryExecutor,
    inline_threads: None,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job's end cancels its stop: no signal goes out after the job is gone."""
    sup = make(cancel_grace_s=30.0)
    job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 600})).job.job_id)
    kills: list[int] = []
    real_kill = machine.kill

    def kill(job_id: str, signum: int = signal.SIGKILL) -> None:
        kills.append(signum)
        real_kill(job_id, signum)

    monkeypatch.setattr(machine, "kill", kill)
    await sup.cancel(job.job_id)
    ended = await wait_status(sup, job.job_id, {JobStatus.CANCELLED})
    await trio.sleep(60)  # well past the grace
    assert (ended.exit_code, kills) == (-15, [signal.SIGTERM])


async def test_the_pause_file_holds_promotion_within_a_second_of_its_creation(
    autojump_clock: trio.testing.MockClock, make: Callable[..., Supervisor], nursery: trio.Nursery
) -> None:
    """The drainer looks at the operator's pause file once a second at most (each look is a thread hop); a file made
    a second ago holds every promotion after it. Virtual time: the look's timing is exact."""
    sup = make(max_concurrent=2, attach=False)
    sup.attach(nursery)  # no drainer task: only the drains below
    assert await sup.drainer.drain() == []  # a first look: no file
    flag = sup.config.pause_flag_path
    await trio.to_thread.run_sync(lambda: flag.parent.mkdir(parents=True, exist_ok=True))
    await trio.to_thread.run_sync(flag.touch)
    await trio.sleep(1.0)
    job = (await sup.enqueue("exit", {"code": 0})).job
    assert await sup.drainer.drain() == []
    assert (await sup.get(job.job_id)).status is JobStatus.QUEUED
    assert (await sup.registry.pause_state()).by == f"pause_file:{sup.config.host_id}"  # whose file (ADR 0012)
