"""Reconcile: tri-state evidence and the rules table of ADR 0001, each row named by the invariant it holds."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
import trio
from core_helpers import (  # type: ignore[import-not-found]
    age_started,
    dead_identity,
    insert_running,
    write_shepherd_marker,
)
from structlog.testing import capture_logs

from supervisor import JobStatus, Liveness, Supervisor
from supervisor.core import NEVER_STARTED, Decision, judge
from supervisor.execution import ORPHAN_DEAD_PID
from supervisor.execution.subprocess import JobFiles, ProcessIdentity, identify

_age = age_started


async def test_prior_boot_live_identity_keeps_its_slot(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new", attach=False)
    identity = identify(bystander.pid)
    job = await insert_running(sup, boot_id="old", identity=identity)
    report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert report.updated == 0
    assert report.details[0].liveness == "alive"
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING


async def test_prior_boot_dead_identity_is_failed_dead_pid(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(boot_id="new", attach=False)
    job = await insert_running(sup, boot_id="old", identity=await dead_identity())
    report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert report.updated == 1
    row = await sup.get(job.job_id)
    assert (row.status, row.error_reason) == (JobStatus.FAILED, "orphan_reconciled_dead_pid")


async def test_this_boot_dead_identity_without_monitor_is_failed_dead_pid(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(boot_id="me", attach=False)
    job = await insert_running(sup, boot_id="me", identity=await dead_identity())
    await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert (await sup.get(job.job_id)).error_reason == "orphan_reconciled_dead_pid"


async def test_recycled_pid_counts_as_dead_INV_PID_NEEDS_BOOT_AND_IDENTITY(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new", attach=False)
    real = identify(bystander.pid)
    assert real is not None
    for other in (
        ProcessIdentity(real.pid, real.start_time + 7, real.kernel_boot_id),  # another process, same number
        ProcessIdentity(real.pid, real.start_time, "another-kernel-boot"),  # recorded before a reboot
    ):
        job = await insert_running(sup, boot_id="old", identity=other)
        await sup.reconciler.reconcile(stale_marks_live_processes=False)
        assert (await sup.get(job.job_id)).error_reason == "orphan_reconciled_dead_pid"
    assert bystander.poll() is None  # reconcile never signals anything


async def test_a_prior_boots_start_that_never_happened_goes_back_to_the_queue_at_once_INV_IDENTITY_BEFORE_PROGRAM(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    # That boot died between the promotion and the start: no start record, and no shepherd of its that could still
    # start it (none ever ran, so no marker). The job provably never ran: back to the queue, the start not counted.
    sup = make_supervisor(boot_id="new", attach=False)
    job = await insert_running(sup, boot_id="old", spawned=False)
    report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert (report.updated, report.details[0].action, report.details[0].reason) == (1, "requeued", NEVER_STARTED)
    row = await sup.get(job.job_id)
    assert (row.status, row.attempts, row.boot_id, row.history) == (JobStatus.QUEUED, 0, None, ())
    assert row.next_attempt_at is None  # no backoff: it never ran


async def test_a_prior_boots_shepherd_that_closed_its_control_has_started_all_it_ever_will(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    # Its shepherd lives on (jobs of its own), but has read the end of its socket: every start sent was handled.
    sup = make_supervisor(boot_id="new", attach=False)
    job = await insert_running(sup, boot_id="old", spawned=False)
    shepherd = identify(bystander.pid)
    assert shepherd is not None
    await trio.to_thread.run_sync(lambda: write_shepherd_marker(sup, "old", shepherd, connected=False))
    await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert (await sup.get(job.job_id)).status is JobStatus.QUEUED


async def test_a_prior_boots_dead_shepherd_can_start_nothing(make_supervisor: Callable[..., Supervisor]) -> None:
    # Killed while its supervisor was connected (its marker says so): dead, it starts nothing more.
    sup = make_supervisor(boot_id="new", attach=False)
    job = await insert_running(sup, boot_id="old", spawned=False)
    gone = await dead_identity()
    await trio.to_thread.run_sync(lambda: write_shepherd_marker(sup, "old", gone, connected=True))
    await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert (await sup.get(job.job_id)).status is JobStatus.QUEUED


async def test_a_prior_boots_start_that_may_still_be_under_way_keeps_its_slot_INV_UNKNOWN_KEEPS_SLOT(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    # That boot died just after sending the start: its shepherd (alive, its supervisor's socket not yet read to the
    # end) may read the request after the supervisor is gone and write the job's record (then run the program) a
    # moment later. No record yet is no proof it never started.
    sup = make_supervisor(boot_id="new", attach=False)
    job = await insert_running(sup, boot_id="old", spawned=False)
    identity = identify(bystander.pid)
    assert identity is not None
    await trio.to_thread.run_sync(lambda: write_shepherd_marker(sup, "old", identity, connected=True))
    with capture_logs() as logs:
        report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert (report.details[0].action, report.details[0].liveness) == ("keep", "unknown")
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING
    assert any(e["event"] == "reconcile_kept_slot" for e in logs)
    # The record appears (the shepherd started it): the next look finds the process and records it.
    files = JobFiles.for_job(job, sup.log_dir)
    record = {"pid": identity.pid, "start_time": identity.start_time, "kernel_boot_id": identity.kernel_boot_id}

    def write_record() -> None:
        files.pid.parent.mkdir(parents=True, exist_ok=True)
        files.pid.write_text(json.dumps(record))

    await trio.to_thread.run_sync(write_record)
    await sup.reconciler.reconcile(stale_marks_live_processes=False)
    row = await sup.get(job.job_id)
    assert (row.status, row.identity) == (JobStatus.RUNNING, identity.to_record())


async def test_a_cancel_of_a_start_that_may_be_under_way_waits_then_ends_cancelled_before_start(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new", attach=False)
    job = await insert_running(sup, boot_id="old", spawned=False)
    shepherd = identify(bystander.pid)
    assert shepherd is not None
    await trio.to_thread.run_sync(lambda: write_shepherd_marker(sup, "old", shepherd, connected=True))
    with capture_logs() as logs:
        after = await sup.cancel(job.job_id)
    assert (after.status, after.cancel_requested) == (JobStatus.RUNNING, True)  # nothing to stop yet: it waits
    assert any(e["event"] == "cancel_pending_start_unconfirmed" for e in logs)
    # The shepherd reads its socket to the end with no start in it: the job provably never started.
    await trio.to_thread.run_sync(lambda: write_shepherd_marker(sup, "old", shepherd, connected=False))
    await sup.reconciler.reconcile(stale_marks_live_processes=False)
    row = await sup.get(job.job_id)
    assert (row.status, row.error_reason) == (JobStatus.CANCELLED, "cancelled_before_start")


async def test_this_boot_spawn_window_is_untouched_INV_RUNNING_MEANS_SPAWNED_OR_SPAWNING(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(boot_id="me", attach=False, stale_after_s=1)
    job = await insert_running(sup, boot_id="me", spawned=False)
    _age(sup, job.job_id, 3600)
    # This boot holds its start (the drainer's entry, no handle yet): nothing to ask the executor, however old.
    sup.boot.ledger.hold([job.job_id])
    report = await sup.reconciler.reconcile(stale_marks_live_processes=True)
    assert (report.details[0].action, report.details[0].reason) == ("untouched", "spawn_window")
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING
    # While a promotion is under way (committed, its rows not yet held), every unspawned row of this boot that a read
    # overlapping it shows may be one of its rows.
    sup.boot.ledger.release(job.job_id)
    with sup.boot.ledger.promoting():
        report = await sup.reconciler.reconcile(stale_marks_live_processes=True)
    assert (report.details[0].action, report.details[0].reason) == ("untouched", "spawn_window")


async def test_this_boot_start_that_nobody_holds_and_never_happened_goes_back_to_the_queue(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """A row this boot promoted whose start nobody holds any more (a drain cancelled part way) was untouched
    for ever as a "spawn window", holding its slot. It is judged on the evidence: no start was ever asked of the
    shepherd and none is recorded, so it provably never ran: back to the queue, the start not counted."""
    sup = make_supervisor(boot_id="me", attach=False)
    job = await insert_running(sup, boot_id="me", spawned=False)
    report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert (report.details[0].action, report.details[0].reason) == ("requeued", NEVER_STARTED)
    row = await sup.get(job.job_id)
    assert (row.status, row.attempts) == (JobStatus.QUEUED, 0)


async def test_unknown_liveness_keeps_the_slot_and_warns_INV_UNKNOWN_KEEPS_SLOT(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new", attach=False)
    job = await insert_running(sup, boot_id="old", pid=bystander.pid)  # a bare pid is no evidence either way
    with capture_logs() as logs:
        report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert report.details[0].liveness == "unknown"
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING
    assert any(e["event"] == "reconcile_kept_slot" and e["log_level"] == "warning" for e in logs)


async def test_sweeper_mode_never_evicts_a_live_job_past_the_window_INV_SWEEP_NEVER_EVICTS_LIVE(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new", attach=False, stale_after_s=60)
    job = await insert_running(sup, boot_id="old", identity=identify(bystander.pid))
    _age(sup, job.job_id, 3600)
    with capture_logs() as logs:
        report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
    assert report.updated == 0
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING
    assert any(e.get("reason") == "wall_clock_exceeded_kept_alive" for e in logs)


async def test_operator_mode_marks_a_live_job_past_the_window_stale(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new", attach=False, stale_after_s=60)
    job = await insert_running(sup, boot_id="old", identity=identify(bystander.pid))
    _age(sup, job.job_id, 3600)
    report = await sup.reconciler.reconcile(stale_marks_live_processes=True)
    assert report.updated == 1
    row = await sup.get(job.job_id)
    assert (row.status, row.error_reason) == (JobStatus.STALE, "wall_clock_stale")
    assert bystander.poll() is None  # freeing the slot is the operator's call; nothing is signalled


async def test_a_disabled_window_never_marks_stale(
    make_supervisor: Callable[..., Supervisor], bystander: subprocess.Popen[bytes]
) -> None:
    sup = make_supervisor(boot_id="new", attach=False, stale_after_s=None)
    job = await insert_running(sup, boot_id="old", identity=identify(bystander.pid))
    _age(sup, job.job_id, 10 * 86400)
    assert (await sup.reconciler.reconcile(stale_marks_live_processes=True)).updated == 0
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING


@pytest.mark.parametrize(
    ("this_boot", "monitored", "spawned", "liveness", "past", "operator", "expected"),
    [
        # INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING: this boot holds its start (``starting``: see the test below)
        (True, True, False, None, True, True, Decision("untouched", reason="spawn_window")),
        # INV-IDENTITY-BEFORE-PROGRAM: a prior boot's row with no process, none still coming: back to the queue
        (False, False, False, None, False, False, Decision("requeue", reason=NEVER_STARTED)),
        # ADR 0014: one of this boot's whose start nobody holds any more (given up on, a drain cancelled part way) is
        # judged on the evidence like a prior boot's: provably never started, back to the queue ...
        (True, False, False, None, True, True, Decision("requeue", reason=NEVER_STARTED)),
        # ... kept while the start may still happen (its shepherd has not answered), never recorded failed
        (
            True,
            False,
            False,
            Liveness.UNKNOWN,
            False,
            False,
            Decision("keep", reason="liveness_unknown_kept", warn=True),
        ),
        # gone with nothing recorded: the ending decides (an orphan, resubmitted while attempts remain)
        (
            False,
            False,
            True,
            Liveness.DEAD,
            True,
            False,
            Decision("finalize_lost", JobStatus.FAILED, "orphan_reconciled_dead_pid"),
        ),
        # INV-UNKNOWN-KEEPS-SLOT: an engine that cannot be asked whether a container was made keeps even an
        # unspawned prior-boot row
        (
            False,
            False,
            False,
            Liveness.UNKNOWN,
            False,
            False,
            Decision("keep", reason="liveness_unknown_kept", warn=True),
        ),
        # a prior boot's live job nobody here watches is adopted (a monitor in this boot's job nursery)
        (False, False, True, Liveness.ALIVE, False, False, Decision("keep", reason="adopted", adopt=True)),
        (
            False,
            False,
            True,
            Liveness.UNKNOWN,
            False,
            False,
            Decision("keep", reason="liveness_unknown_kept", warn=True),
        ),
        (
            False,
            False,
            True,
            Liveness.UNKNOWN,
            True,
            False,
            Decision("keep", reason="wall_clock_exceeded_kept_alive", warn=True),
        ),
        (False, False, True, Liveness.UNKNOWN, True, True, Decision("finalize", JobStatus.STALE, "wall_clock_stale")),
        # this boot's monitor finalizes its own child with the real exit code: reconcile leaves it be
        (True, True, True, Liveness.DEAD, False, False, Decision("keep", reason="alive")),
    ],
)
def test_judge_table(
    this_boot: bool,
    monitored: bool,
    spawned: bool,
    liveness: Liveness | None,
    past: bool,
    operator: bool,
    expected: Decision,
) -> None:
    job = type("J", (), {"spawned": spawned, "cancel_requested": False})()
    got = judge(
        job,  # type: ignore[arg-type]
        this_boot=this_boot,
        monitored=monitored,
        liveness=liveness,
        past_window=past,
        stale_marks_live_processes=operator,
        # This boot's unspawned row that it watches is one whose start it holds (JobLedger.being_started).
        starting=this_boot and monitored and not spawned,
        orphan_reason=ORPHAN_DEAD_PID,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("exit_recorded", "exit_pending", "expected"),
    [
        # INV-TRUE-OUTCOME: the shepherd wrote how it ended: that is the outcome, never a guess
        (True, False, Decision("finalize_exit", reason="exit_recorded")),
        (True, True, Decision("finalize_exit", reason="exit_recorded")),
        # dead, not yet recorded, but its shepherd lives (about to reap it): adopt and wait for the record
        (False, True, Decision("keep", reason="exit_being_recorded", adopt=True)),
        # dead, nothing recorded, its shepherd gone too: an orphan (resubmitted while attempts remain)
        (False, False, Decision("finalize_lost", JobStatus.FAILED, "orphan_reconciled_dead_pid")),
    ],
)
def test_judge_uses_the_recorded_exit(exit_recorded: bool, exit_pending: bool, expected: Decision) -> None:
    job = type("J", (), {"spawned": True, "cancel_requested": False})()
    got = judge(
        job,  # type: ignore[arg-type]
        this_boot=False,
        monitored=False,
        liveness=Liveness.DEAD,
        past_window=False,
        stale_marks_live_processes=False,
        exit_recorded=exit_recorded,
        exit_pending=exit_pending,
        starting=False,
        orphan_reason=ORPHAN_DEAD_PID,
    )
    assert got == expected


def test_judge_names_a_dead_job_without_record_as_its_mode_does() -> None:
    job = type("J", (), {"spawned": True, "cancel_requested": False})()
    got = judge(
        job,  # type: ignore[arg-type]
        this_boot=False,
        monitored=False,
        liveness=Liveness.DEAD,
        past_window=False,
        stale_marks_live_processes=False,
        starting=False,
        orphan_reason="orphan_reconciled_no_container",
    )
    assert got == Decision("finalize_lost", JobStatus.FAILED, "orphan_reconciled_no_container")


@pytest.mark.parametrize(
    ("spawned", "expected"),
    [
        (False, Decision("finalize", JobStatus.CANCELLED, "cancelled_before_start")),
        (True, Decision("finalize", JobStatus.CANCELLED, "cancelled")),
    ],
)
def test_judge_ends_a_gone_job_whose_cancel_was_pending_cancelled_not_orphaned(
    spawned: bool, expected: Decision
) -> None:
    """A cancel left pending (the engine could not be asked) is honoured once the job is found gone."""
    job = type("J", (), {"spawned": spawned, "cancel_requested": True})()
    got = judge(
        job,  # type: ignore[arg-type]
        this_boot=False,
        monitored=False,
        liveness=Liveness.DEAD,
        past_window=False,
        stale_marks_live_processes=False,
        starting=False,
        orphan_reason=ORPHAN_DEAD_PID,
    )
    assert got == expected
