"""Cancel in every phase. INV-NEVER-BLIND-SIGNAL: a process whose identity does not match is never signalled."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
import trio
from core_helpers import enqueue_raw, insert_running, pid_of, wait_running, wait_status, wait_terminal  # type: ignore[import-not-found]
from structlog.testing import capture_logs

from supervisor import JobNotFound, JobStatus, Liveness, Supervisor
from supervisor.execution.subprocess import identify, probe


async def test_cancel_queued_job_ends_it_before_start(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor()
    await sup.pause()
    job = (await sup.enqueue("sleep", {"seconds": 30})).job
    cancelled = await sup.cancel(job.job_id)
    assert (cancelled.status, cancelled.error_reason, pid_of(cancelled)) == (
        JobStatus.CANCELLED,
        "cancelled_before_start",
        None,
    )


async def test_cancel_running_job_sends_sigterm_and_ends_cancelled(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor()
    job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    assert (await sup.cancel(job.job_id)).cancel_requested
    ended = await wait_terminal(sup, job.job_id, timeout_s=5)
    assert (ended.status, ended.error_reason, ended.exit_code) == (JobStatus.CANCELLED, "cancelled", -15)


async def test_cancel_escalates_to_sigkill_after_the_grace_period(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(cancel_grace_s=0.5)
    job = (await sup.enqueue("term_ignorer", {})).job

    async def ready() -> bool | None:
        return (await sup.read_log(job.job_id)).startswith(b"ready") or None

    from core_helpers import poll  # type: ignore[import-not-found]

    await poll(ready, timeout_s=10)
    await sup.cancel(job.job_id)
    ended = await wait_terminal(sup, job.job_id, timeout_s=10)
    assert (ended.status, ended.exit_code) == (JobStatus.CANCELLED, -9)


async def test_cancel_in_the_spawn_window_is_carried_out_when_spawn_completes(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = make_supervisor()
    release = trio.Event()
    in_spawn = trio.Event()
    real_start = sup.boot.executor.start

    async def slow_start(launch):  # type: ignore[no-untyped-def]
        in_spawn.set()
        await release.wait()
        return await real_start(launch)

    # The executor's start (the seam every exec mode implements) held open: the row is RUNNING, with no process yet.
    monkeypatch.setattr(sup.boot.executor, "start", slow_start)
    argv = sup.kinds.get("sleep").render_argv({"seconds": 60.0})
    queued = (await enqueue_raw(sup, "sleep", {"seconds": 60.0}, argv))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sup.drainer.drain)
        await in_spawn.wait()
        row = await sup.cancel(queued.job_id)
        assert (row.status, row.cancel_requested, pid_of(row)) == (JobStatus.RUNNING, True, None)
        release.set()
    ended = await wait_terminal(sup, queued.job_id, timeout_s=5)
    assert ended.status is JobStatus.CANCELLED
    assert pid_of(ended) is not None  # it did spawn, and was stopped as soon as it had


async def test_cancel_terminal_job_is_a_noop_and_unknown_is_not_found(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    job = (await sup.enqueue("exit", {"code": 0})).job
    done = await wait_terminal(sup, job.job_id)
    assert await sup.cancel(job.job_id) == done
    with pytest.raises(JobNotFound):
        await sup.cancel("no-such-job")


async def test_cancel_prior_boot_job_with_matching_identity_signals_it_INV_NEVER_BLIND_SIGNAL(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new-boot")
    identity = identify(bystander.pid)
    assert identity is not None
    job = await insert_running(sup, boot_id="old-boot", identity=identity)
    row = await sup.cancel(job.job_id)
    # Signalled; the row ends cancelled once the process is gone (which may already be the case here).
    assert row.status in (JobStatus.RUNNING, JobStatus.CANCELLED)
    assert await trio.to_thread.run_sync(bystander.wait) == -15
    ended = await wait_terminal(sup, job.job_id, timeout_s=5)
    assert (ended.status, ended.error_reason) == (JobStatus.CANCELLED, "cancelled")


async def test_cancel_prior_boot_job_whose_pid_was_recycled_never_signals_it_INV_NEVER_BLIND_SIGNAL(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new-boot")
    real = identify(bystander.pid)
    assert real is not None
    # The row recorded this pid number for a different process: same pid, other start time.
    recycled = type(real)(real.pid, real.start_time - 1, real.kernel_boot_id)
    assert probe(recycled) is Liveness.DEAD
    job = await insert_running(sup, boot_id="old-boot", identity=recycled)
    with capture_logs() as logs:
        row = await sup.cancel(job.job_id)
    assert (row.status, row.error_reason) == (JobStatus.CANCELLED, "cancelled_unverified_process_left_alone")
    assert bystander.poll() is None  # never signalled
    assert probe(real) is Liveness.ALIVE
    assert not [e for e in logs if e["event"] == "cancel_left_process_alone"]  # dead for us: nothing left


async def test_cancel_prior_boot_job_with_unverifiable_identity_logs_the_pid_left_alone(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new-boot")
    # A bare pid (no start time): no identity, so no signal, and an ERROR names the pid.
    job = await insert_running(sup, boot_id="old-boot", pid=bystander.pid)
    with capture_logs() as logs:
        row = await sup.cancel(job.job_id)
    assert row.status is JobStatus.CANCELLED
    assert bystander.poll() is None
    errors = [e for e in logs if e["event"] == "cancel_left_process_alone"]
    assert errors and errors[0]["pid"] == bystander.pid and errors[0]["log_level"] == "error"


async def test_a_cancelled_running_job_frees_its_slot_for_the_next(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(max_concurrent=1)
    first = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    second = (await sup.enqueue("exit", {"code": 0})).job
    assert (await sup.get(second.job_id)).status is JobStatus.QUEUED
    await sup.cancel(first.job_id)
    assert (await wait_terminal(sup, second.job_id)).status is JobStatus.SUCCEEDED
    await wait_status(sup, first.job_id, {JobStatus.CANCELLED})
