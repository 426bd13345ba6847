"""The core's scenarios that hold in every exec mode, run against each executor: the shepherd's processes, the
in-memory one, and containers on a real Docker engine (marked ``docker``).

Nothing here reaches into an executor's internals: a test enqueues, watches the registry, and does to a job only
what the outside world can (kill it, let it end while no supervisor runs).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import structlog
import trio
from core_executors import (  # type: ignore[import-not-found]
    DockerWorld,
    MemoryWorld,
    SubprocessWorld,
    World,
    supervisors_in,
)
from core_helpers import poll, wait_running, wait_status, wait_terminal  # type: ignore[import-not-found]

from supervisor import JobStatus, RegistryError, Supervisor
from supervisor.domain import Job, PageRequest, hash_token
from supervisor.registry import PromoteRequest


@pytest.fixture(params=["subprocess", "memory", pytest.param("docker", marks=pytest.mark.docker)])
async def world(request: pytest.FixtureRequest, nursery: trio.Nursery) -> AsyncIterator[World]:
    made: World
    if request.param == "subprocess":
        made = SubprocessWorld()
    elif request.param == "memory":
        made = MemoryWorld(nursery)
    else:
        made = DockerWorld()
    yield made


@pytest.fixture
async def make(make_supervisor: Callable[..., Supervisor], world: World) -> AsyncIterator[Callable[..., Supervisor]]:
    """``make_supervisor`` with the world's executor; leftovers of a failed test are stopped at the end."""
    async with supervisors_in(world, make_supervisor) as make_:
        yield make_


async def test_a_job_that_exits_0_succeeds_with_its_output_in_its_log(make: Callable[..., Supervisor]) -> None:
    sup = make()
    job = (await sup.enqueue("exit", {"code": 0})).job
    done = await wait_terminal(sup, job.job_id)
    assert (done.status, done.error_reason, done.exit_code) == (JobStatus.SUCCEEDED, None, 0)
    assert (await sup.read_log(job.job_id)) == b"bye\n"


async def test_a_job_that_exits_7_fails_exit_code_7(make: Callable[..., Supervisor]) -> None:
    sup = make()
    job = (await sup.enqueue("exit", {"code": 7})).job
    done = await wait_terminal(sup, job.job_id)
    assert (done.status, done.error_reason, done.exit_code) == (JobStatus.FAILED, "exit_code_7", 7)


async def test_a_job_killed_from_outside_is_finalized_by_its_monitor_and_the_next_starts(
    make: Callable[..., Supervisor], world: World
) -> None:
    sup = make(max_concurrent=1, sweep_interval_s=3600)  # no sweeper runs: the monitor alone must notice
    first = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    second = (await sup.enqueue("sleep", {"seconds": 60})).job
    await world.akill(first)
    dead = await wait_terminal(sup, first.job_id, timeout_s=10)
    assert (dead.status, dead.error_reason) == (JobStatus.FAILED, world.killed_reason)
    await wait_status(sup, second.job_id, {JobStatus.RUNNING}, timeout_s=10)
    await sup.cancel(second.job_id)
    assert (await wait_terminal(sup, second.job_id)).status is JobStatus.CANCELLED


async def test_cancel_of_a_running_job_ends_it_cancelled_and_stops_it(
    make: Callable[..., Supervisor], world: World
) -> None:
    sup = make()
    job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    assert (await sup.cancel(job.job_id)).cancel_requested
    ended = await wait_terminal(sup, job.job_id, timeout_s=10)
    assert (ended.status, ended.error_reason) == (JobStatus.CANCELLED, "cancelled")
    assert await world.agone(ended)


async def _boot_dies_while(sup_factory: Callable[..., Supervisor], kind: str, params: dict[str, object]) -> Job:
    """Boot "old" starts one job, then dies (its nursery is cancelled: no monitor, no shepherd reader); the job
    runs on. Returns its row as the old boot left it."""
    async with trio.open_nursery() as old_boot:
        old = sup_factory(boot_id="old", attach=old_boot)
        job = await wait_running(old, (await old.enqueue(kind, params)).job.job_id)
        old_boot.cancel_scope.cancel()
    return job


async def test_a_prior_boots_running_job_is_adopted_and_finalized_with_its_true_outcome(
    make: Callable[..., Supervisor], world: World
) -> None:
    def factory(**kwargs: object) -> Supervisor:
        return make(max_concurrent=1, **kwargs)

    probe = make(boot_id="probe", attach=False)
    gate = probe.data_dir / "gate"  # in the data dir: a container sees it at the same path
    job = await _boot_dies_while(factory, "gated", {"gate": str(gate), "code": 7})
    sup_new = factory(boot_id="new")
    report = await sup_new.reconciler.reconcile(stale_marks_live_processes=False)
    [detail] = report.details
    assert (detail.action, detail.reason, detail.liveness, detail.prior_boot) == ("keep", "adopted", "alive", True)
    # Its slot is held: nothing else starts, and it is not started a second time.
    queued = (await sup_new.enqueue("exit", {"code": 0})).job
    assert (await sup_new.get(queued.job_id)).status is JobStatus.QUEUED
    await trio.to_thread.run_sync(functools.partial(gate.write_text, "open"))
    ended = await wait_terminal(sup_new, job.job_id)
    assert (ended.status, ended.error_reason, ended.exit_code, ended.attempts) == (
        JobStatus.FAILED,
        "exit_code_7",
        7,
        1,
    )
    assert (await wait_terminal(sup_new, queued.job_id)).status is JobStatus.SUCCEEDED


async def test_a_job_that_ended_while_no_supervisor_ran_gets_its_true_outcome_at_the_next_boot(
    make: Callable[..., Supervisor], world: World
) -> None:
    probe = make(boot_id="probe", attach=False)
    gate = probe.data_dir / "gate"
    job = await _boot_dies_while(make, "gated", {"gate": str(gate), "code": 0})
    await trio.to_thread.run_sync(functools.partial(gate.write_text, "open"))

    async def ended() -> bool | None:
        return await world.aended(job) or None

    await poll(ended)  # it ended, and nobody has judged it yet
    assert (await probe.get(job.job_id)).status is JobStatus.RUNNING
    new = make(boot_id="new")
    report = await new.reconciler.reconcile(stale_marks_live_processes=False)
    assert report.updated == 1
    row = await new.get(job.job_id)
    # INV-TRUE-OUTCOME: the recorded exit, not an orphan guess; attempts=1: it never ran twice.
    assert (row.status, row.error_reason, row.exit_code, row.attempts) == (JobStatus.SUCCEEDED, None, 0, 1)
    assert (await new.read_log(job.job_id)) == b"gate open\n"
    follow_ups = (await new.list_jobs(PageRequest.parse(kind="done")))[0]
    assert len(follow_ups) == 1  # the kind's `then` fired, once
    assert (await wait_terminal(new, follow_ups[0].job_id)).status is JobStatus.SUCCEEDED


async def test_cancel_of_a_prior_boots_job_stops_it_and_ends_it_cancelled(
    make: Callable[..., Supervisor], world: World
) -> None:
    job = await _boot_dies_while(make, "sleep", {"seconds": 60})
    new = make(boot_id="new")
    row = await new.cancel(job.job_id)
    assert row.status in (JobStatus.RUNNING, JobStatus.CANCELLED)  # stopped; cancelled once it is gone
    ended = await wait_terminal(new, job.job_id, timeout_s=15)
    assert (ended.status, ended.error_reason) == (JobStatus.CANCELLED, "cancelled")
    assert await world.agone(ended)


async def test_a_prior_boots_job_lost_with_its_record_is_the_modes_orphan_never_a_guess(
    make: Callable[..., Supervisor], world: World
) -> None:
    """INV-TRUE-OUTCOME's other side: with nothing on record of how it ended (subprocess: its shepherd was killed
    too; docker: its container was removed), the next boot says so; it never guesses success."""
    job = await _boot_dies_while(make, "sleep", {"seconds": 60})
    await world.alose(job)
    new = make(boot_id="new")

    async def gone() -> bool | None:
        return await world.agone(job) or None

    await poll(gone)
    report = await new.reconciler.reconcile(stale_marks_live_processes=False)
    [detail] = report.details
    assert (detail.liveness, detail.prior_boot) == ("dead", True)
    ended = await new.get(job.job_id)
    assert (ended.status, ended.error_reason, ended.exit_code) == (JobStatus.FAILED, world.lost_reason, None)


async def test_a_boot_killed_between_start_and_recording_the_identity_is_adopted_not_freed(
    make: Callable[..., Supervisor], world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """INV-IDENTITY-BEFORE-PROGRAM: what the executor writes before the program runs (the shepherd's start file, the
    container's labels) lets the next boot find a job whose identity never reached the row."""
    async with trio.open_nursery() as old_boot:
        old = make(boot_id="old", max_concurrent=1, attach=old_boot)

        async def lost(*args: object, **kwargs: object) -> None:
            raise RegistryError("the supervisor died before it recorded the identity")

        monkeypatch.setattr(old.registry, "record_identities", lost)
        job = (await old.enqueue("sleep", {"seconds": 60})).job

        async def started() -> bool | None:  # promoted and started, its identity never recorded
            return await trio.to_thread.run_sync(world.started, old.log_dir, job.job_id) or None

        await poll(started)
        old_boot.cancel_scope.cancel()
    row = await old.get(job.job_id)
    assert (row.status, row.spawned) == (JobStatus.RUNNING, False)

    new = make(boot_id="new", max_concurrent=1)
    [detail] = (await new.reconciler.reconcile(stale_marks_live_processes=False)).details
    assert (detail.action, detail.reason, detail.liveness) == ("keep", "adopted", "alive")
    adopted = await new.get(job.job_id)
    assert (adopted.status, adopted.spawned, adopted.attempts) == (JobStatus.RUNNING, True, 1)
    queued = (await new.enqueue("exit", {"code": 0})).job
    assert (await new.get(queued.job_id)).status is JobStatus.QUEUED  # its slot was not freed: no overshoot
    await new.cancel(job.job_id)
    ended = await wait_terminal(new, job.job_id, timeout_s=15)
    assert (ended.status, ended.error_reason) == (JobStatus.CANCELLED, "cancelled")
    assert (await wait_terminal(new, queued.job_id)).status is JobStatus.SUCCEEDED


async def test_stall_action_terminate_stops_a_stalled_job_through_its_executor(
    make: Callable[..., Supervisor], world: World
) -> None:
    """`terminate` (ADR 0002 D9) in every exec mode: a job that makes no progress is stopped as a cancel would stop it
    (SIGTERM/SIGKILL through the shepherd, `docker stop`), and its row ends stale/progress_stalled once it is gone."""
    sup = make(progress_stale_after_s=0.3, stall_action="terminate", cancel_grace_s=1.0, sweep_interval_s=3600)
    job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)

    async def ended() -> Job | None:
        # The sweeper's judgement, run by hand: the stall is noticed by a sweep, never by the job.
        await sup.sweeper.sweep()
        row = await sup.get(job.job_id)
        return row if row.status.is_terminal else None

    final = await poll(ended, timeout_s=30)
    assert (final.status, final.error_reason, final.stalled) == (JobStatus.STALE, "progress_stalled", True)
    assert await world.agone(final)


# -- crash-only recovery (ADR 0009): kill and resubmit ---------------------------------------------------------


async def _running_attempt(sup: Supervisor, job_id: str, attempt: int) -> Job:
    async def check() -> Job | None:
        row = await sup.get(job_id)
        return row if row.status is JobStatus.RUNNING and row.spawned and row.attempts == attempt else None

    return await poll(check, timeout_s=20)


async def test_a_crashed_job_is_resubmitted_under_its_id_until_its_attempts_are_spent(
    make: Callable[..., Supervisor], world: World
) -> None:
    sup = make(max_concurrent=1, sweep_interval_s=3600)  # the monitor and the drainer alone: no sweep helps
    job = await wait_running(sup, (await sup.enqueue("retried_sleep", {"seconds": 60})).job.job_id)
    assert (job.attempts, job.max_attempts, job.history) == (1, 2, ())
    first_log = job.log_path
    with structlog.testing.capture_logs() as logs:
        await world.akill(job)  # a SIGKILL the supervisor did not send: a crash
        again = await _running_attempt(sup, job.job_id, 2)  # same id, started again once its backoff passed
    # The row back in the queue forgets the process; the log line of its end still names the one that was killed.
    [resubmitted] = [e for e in logs if e["event"] == "job_transition" and e["to"] == "queued"]
    assert resubmitted["from"] == "running" and job.identity is not None and job.identity.fields
    assert {key: resubmitted.get(key) for key in job.identity.fields} == dict(job.identity.fields)
    [attempt] = again.history
    assert (attempt.attempt, attempt.status, attempt.reason) == (1, JobStatus.FAILED, world.killed_reason)
    assert attempt.started_at == job.started_at and attempt.ended_at is not None
    assert again.log_path != first_log  # each attempt its own log (and, in docker mode, its own container)
    await world.akill(again)
    final = await wait_terminal(sup, job.job_id)
    # Its attempts spent: the last crash is its outcome, the earlier one in its history.
    assert (final.status, final.error_reason, final.attempts, len(final.history)) == (
        JobStatus.FAILED,
        world.killed_reason,
        2,
        1,
    )


async def test_an_exit_code_the_kind_lists_is_retried_and_any_other_is_final(
    make: Callable[..., Supervisor],
) -> None:
    sup = make()
    tempfail = (await sup.enqueue("retried_exit", {"code": 75})).job
    other = (await sup.enqueue("retried_exit", {"code": 7})).job
    failed = await wait_terminal(sup, tempfail.job_id)
    assert (failed.error_reason, failed.attempts, [a.reason for a in failed.history]) == (
        "exit_code_75",
        3,
        ["exit_code_75", "exit_code_75"],
    )
    once = await wait_terminal(sup, other.job_id)
    assert (once.error_reason, once.attempts, once.history) == ("exit_code_7", 1, ())


async def test_a_job_waiting_out_its_backoff_is_cancelled_at_once(
    make: Callable[..., Supervisor], world: World
) -> None:
    sup = make()
    job = await wait_running(sup, (await sup.enqueue("patient_sleep", {"seconds": 60})).job.job_id)
    await world.akill(job)
    waiting = await wait_status(sup, job.job_id, {JobStatus.QUEUED})
    assert waiting.next_attempt_at is not None and waiting.attempts == 1  # an hour's backoff ahead of it
    ended = await sup.cancel(job.job_id)
    assert (ended.status, ended.error_reason, len(ended.history)) == (JobStatus.CANCELLED, "cancelled", 1)


async def test_a_cancelled_job_is_never_resubmitted(make: Callable[..., Supervisor]) -> None:
    sup = make()
    job = await wait_running(sup, (await sup.enqueue("retried_sleep", {"seconds": 60})).job.job_id)
    await sup.cancel(job.job_id)
    ended = await wait_terminal(sup, job.job_id, timeout_s=15)
    assert (ended.status, ended.attempts, ended.history) == (JobStatus.CANCELLED, 1, ())


async def test_a_prior_boots_start_that_never_happened_runs_at_the_next_boot_uncounted(
    make: Callable[..., Supervisor], world: World
) -> None:
    """The boot died after promoting the job and before its executor started it (no start record, no container):
    the next boot puts it back at the head of the queue at once and runs it, as its first attempt."""
    old = make(boot_id="old", attach=False)
    queued = (await old.enqueue("exit", {"code": 0})).job
    [promoted] = (await old.registry.promote(PromoteRequest(1, "old", [hash_token("t")], old.log_dir))).jobs
    assert (promoted.job_id, promoted.status, promoted.spawned) == (queued.job_id, JobStatus.RUNNING, False)
    new = make(boot_id="new", max_concurrent=1)
    [detail] = (await new.reconciler.reconcile(stale_marks_live_processes=False)).details
    assert (detail.action, detail.reason) == ("requeued", "never_started")
    done = await wait_terminal(new, queued.job_id)
    assert (done.status, done.attempts, done.history, done.boot_id) == (JobStatus.SUCCEEDED, 1, (), "new")


@contextlib.asynccontextmanager
async def read_only(directory: Path) -> AsyncIterator[None]:
    """A read-only tmpfs mounted over ``directory``: the tests run as root, whom no chmod stops; a read-only mount
    does. Skips where no mount can be made (not root)."""
    await trio.Path(directory).mkdir(parents=True, exist_ok=True)
    with trio.fail_after(10):
        mounted = await trio.run_process(
            ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(directory)],
            check=False,
            capture_stdout=True,
            capture_stderr=True,
        )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield
    finally:
        with trio.fail_after(10):
            # Lazy: detached even while something still uses it (a failed test's job), never left behind.
            await trio.run_process(["umount", "--lazy", str(directory)])


async def test_a_read_only_log_directory_fails_each_start_naming_it_and_harms_nothing_else(
    make: Callable[..., Supervisor],
) -> None:
    """INV-NO-START-WITHOUT-LOG: a job whose output could not be kept is not started; its row ends spawn_failed with
    a reason naming the path, its slot is free at once, and the job already running and the next ones are fine."""
    sup = make(max_concurrent=2)
    gate = sup.data_dir / "gate"  # in the data dir: a container sees it at the same path
    running = await wait_running(sup, (await sup.enqueue("gated", {"gate": str(gate), "code": 0})).job.job_id)
    async with read_only(sup.log_dir):
        # Two in a row with one slot free: the first failure gave its slot back.
        for _ in range(2):
            failed = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)
            assert failed.status is JobStatus.FAILED
            reason = failed.error_reason or ""
            assert reason.startswith("spawn_failed: cannot write the job's log ") and "Read-only file system" in reason
            assert str(sup.log_dir) in reason
        assert (await sup.get(running.job_id)).status is JobStatus.RUNNING
    after = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)
    assert (after.status, await sup.read_log(after.job_id)) == (JobStatus.SUCCEEDED, b"bye\n")
    await trio.to_thread.run_sync(functools.partial(gate.write_text, "open"))
    ended = await wait_terminal(sup, running.job_id)
    assert (ended.status, ended.exit_code, await sup.read_log(ended.job_id)) == (JobStatus.SUCCEEDED, 0, b"gate open\n")


async def test_a_file_in_the_log_directorys_place_fails_the_start_naming_it(make: Callable[..., Supervisor]) -> None:
    """Whether the file is there before the first start (the drainer makes the directory) or replaces the directory
    later (the executor checks), the start fails naming the path, and once the directory is back jobs run again."""
    sup = make()
    log_dir = trio.Path(sup.log_dir)
    await log_dir.parent.mkdir(parents=True, exist_ok=True)
    await log_dir.write_text("not a directory")
    first = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)
    in_place = f"spawn_failed: cannot create the job log directory {sup.log_dir}: a file is in its place"
    assert first.error_reason == in_place
    await log_dir.unlink()
    assert (await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)).status is JobStatus.SUCCEEDED

    moved = await log_dir.rename(log_dir.with_name("jobs-moved"))
    await log_dir.write_text("not a directory")
    second = await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)
    assert second.error_reason == (
        f"spawn_failed: cannot write the job's log {second.log_path}: Not a directory ({sup.log_dir})"
    )
    await log_dir.unlink()
    await moved.rename(log_dir)
    assert (await wait_terminal(sup, (await sup.enqueue("exit", {"code": 0})).job.job_id)).status is JobStatus.SUCCEEDED
