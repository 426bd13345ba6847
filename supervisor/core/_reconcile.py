"""Reconcile: bring every RUNNING row in line with the evidence (ADR 0001 §3-§6).

The executor's evidence is gathered before any registry write (a probe may block, and the write lock is shared
with every other process); each verdict is then applied only if the row still records the process the evidence was
about (``Expect``). The verdicts come from ``_rules.judge``; this module carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import trio

from ..domain import ExitStatus, Job, JobNotFound, JobStatus, Liveness
from ..execution import Evidence, JobHandle
from ..observe import get_logger
from ..registry import Expect, IdentityClaim, Outcome
from ._boot import Boot
from ._monitor import Monitors
from ._ports import DrainBell
from ._rules import STOP_DEADLINE, STOP_STALL, Decision, attempt_ended, judge, past_window

log = get_logger()


@dataclass(frozen=True)
class ReconcileDetail:
    job_id: str
    action: str  # "failed" | "stale" | "cancelled" | "succeeded" | "queued" (resubmitted) | "requeued" | "keep" | ...
    reason: str
    liveness: str | None
    prior_boot: bool
    # An operator's stale mark of a process verified alive (ADR 0001 §6): the row ended, the process runs on.
    still_running: bool = False


@dataclass(frozen=True)
class ReconcileReport:
    updated: int
    details: list[ReconcileDetail]


@dataclass
class _RowsRead:
    """What reconcile read before gathering evidence: the rows to judge, the details of those left alone, and the
    jobs watched as the read began."""

    rows: list[Job] = field(default_factory=list)
    details: list[ReconcileDetail] = field(default_factory=list)
    watched_before: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class _Done:
    """What carrying a verdict out did: the row's action for the report, whether the row changed, and whether its
    process runs on (an operator's stale mark of a live process)."""

    action: str
    changed: bool
    still_running: bool = False


_UNTOUCHED = _Done("untouched", changed=False)  # the row was no longer the one the evidence was about


@dataclass(frozen=True)
class _Judged:
    detail: ReconcileDetail
    changed: bool


def _say_slot_kept(job: Job, decision: Decision, found: Evidence, *, prior_boot: bool) -> None:
    # An engine that does not answer is said once per episode by the executor (and shown by /api/health):
    # the rows it keeps are no WARNING at every sweep.
    (log.debug if found.outage else log.warning)(
        "reconcile_kept_slot",
        job_id=job.job_id,
        reason=decision.reason,
        liveness=found.liveness.value if found.liveness else None,
        **(dict(job.identity.fields) if job.identity else {}),
        detail=found.detail,
        prior_boot=prior_boot,
        started_at=str(job.started_at),
    )


class Reconciler:
    def __init__(self, boot: Boot, monitors: Monitors, drain_bell: DrainBell) -> None:
        self.boot = boot
        self.monitors = monitors
        self._drain_bell = drain_bell
        self._lock = trio.Lock()

    async def reconcile(self, *, stale_marks_live_processes: bool) -> ReconcileReport:
        """One pass over this host's RUNNING rows. One at a time (the sweep's, the operator's): each acts on evidence
        gathered before its writes, and two at once would act twice on the same evidence."""
        async with self._lock:
            return await self._reconcile(stale_marks_live_processes=stale_marks_live_processes)

    async def _reconcile(self, *, stale_marks_live_processes: bool) -> ReconcileReport:
        read = await self._read_rows_to_judge()
        evidence = await self.monitors.evidence(read.rows)
        now = self.boot.wall_clock()
        details, updated = read.details, 0
        for job, found in zip(read.rows, evidence, strict=True):
            judged = await self._reconcile_row(job, found, read.watched_before, now, stale_marks_live_processes)
            if judged is not None:
                details.append(judged.detail)
                updated += judged.changed
        if updated:
            self._drain_bell.ring()
        return ReconcileReport(updated, details)

    async def _read_rows_to_judge(self) -> _RowsRead:
        """This host's RUNNING rows to judge on the evidence, and a detail for each row left alone (its start under
        way here, or watched though its identity could not be recorded)."""
        boot, ledger = self.boot, self.boot.ledger
        read = _RowsRead()
        mark = ledger.promotion_mark()
        # A monitor may end its job and let go of it while the rows are read and the evidence gathered: a row read
        # running and watched then is still its monitor's (the authority on what it watches), never adopted again.
        read.watched_before = ledger.job_ids()
        running = await boot.registry.running_jobs()
        # A promotion under way during the read may have put rows in it whose starts are not yet held in the ledger.
        overlapped = mark[0] > 0 or ledger.promotion_mark()[1] != mark[1]
        # ADR 0012: another host's rows are that host's to judge; this one cannot see their processes.
        for job in running:
            if not boot.owns(job):
                continue
            if job.boot_id == boot.boot_id and not job.spawned and (overlapped or job.job_id in ledger):
                # INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING: its start is (or may be) under way here -- nothing to ask the
                # executor yet; once nobody holds it, the next reconcile judges it on the evidence -- or this boot
                # started it and its monitor watches it, though the registry could not record its identity then:
                # the monitor, which holds the row as it was (no identity), records its end. Recording the identity
                # found here under it would make that end's guard refuse it.
                reason = "spawn_window" if overlapped or ledger.being_started(job.job_id) else "watched_unrecorded"
                read.details.append(ReconcileDetail(job.job_id, "untouched", reason, None, False))
                continue
            read.rows.append(job)
            watched = ledger.entry(job.job_id)
            if job.cancel_requested and watched is not None and not watched.cancel_requested:
                watched.request_cancel()  # asked through another host: carried out here, where the job runs
        return read

    async def _reconcile_row(
        self, job: Job, found: Evidence, watched_before: set[str], now: datetime, stale_marks_live_processes: bool
    ) -> _Judged | None:
        """Judge one row on its evidence and carry the verdict out: its detail and whether the row changed (None: it
        ended meanwhile)."""
        boot = self.boot
        this_boot = job.boot_id == boot.boot_id
        if found.found is not None:
            # A prior boot died between the start and recording the identity: what the executor wrote before the
            # program ran (a start file, a labelled container) names it, so it is judged (and adopted) like any
            # recorded one, never freed as a spawn window.
            [job] = await boot.registry.record_identities([IdentityClaim(job.job_id, found.found)])
            if job.status is not JobStatus.RUNNING:
                return None
        decision = judge(
            job,
            this_boot=this_boot,
            monitored=job.job_id in boot.ledger or job.job_id in watched_before,
            liveness=found.liveness,
            past_window=past_window(job.started_at, now, boot.config.stale_after_s),
            stale_marks_live_processes=stale_marks_live_processes,
            exit_recorded=found.exit_status is not None,
            exit_pending=found.exit_pending,
            # Asked again after the evidence (no other task requeues a row nobody holds, so none can be promoted
            # and held again meanwhile: this only keeps the rule's input whole).
            starting=this_boot and boot.ledger.being_started(job.job_id),
            orphan_reason=boot.executor.orphan_reason,
        )
        done = await self._carry_out(job, decision, found)
        if decision.adopt and found.handle is not None and boot.tree.attached:
            await self.monitors.adopt(job, found.handle, cancel=job.cancel_requested)  # a cancel left pending
        if decision.warn:
            _say_slot_kept(job, decision, found, prior_boot=not this_boot)
        seen = found.liveness.value if found.liveness else None
        detail = ReconcileDetail(job.job_id, done.action, decision.reason, seen, not this_boot, done.still_running)
        return _Judged(detail, done.changed)

    async def _carry_out(self, job: Job, decision: Decision, found: Evidence) -> _Done:
        """The verdict's write, only if the row is still the one the evidence was about (``expect``; else
        ``untouched``); a verdict that asks no write (keep, adopt) is its own action."""
        if decision.action == "finalize":
            return await self._finalize(job, decision, found)
        if decision.action == "finalize_lost":
            # Gone with nothing recorded: an orphan, resubmitted while its kind allows more attempts.
            return await self._finish(job, None, found)
        if decision.action == "requeue":
            return await self._requeue(job, decision, found)
        if decision.action == "finalize_exit":
            assert found.exit_status is not None and found.handle is not None
            await self.boot.executor.collect(found.handle)
            return await self._finish(job, found.exit_status, found)
        return _Done(decision.action, changed=False)

    async def _finalize(self, job: Job, decision: Decision, found: Evidence) -> _Done:
        """The verdict's own status (stale, failed, ...), recorded as decided."""
        assert decision.status is not None
        # expect: the evidence was gathered before the write; only act if the row is still that process.
        if not await self.monitors.finalize(job, Outcome(decision.status, decision.reason), expect=job):
            return _UNTOUCHED
        still_running = decision.status is JobStatus.STALE and found.liveness is Liveness.ALIVE
        if still_running:
            log.warning(
                "job_marked_stale_while_running",
                job_id=job.job_id,
                **(dict(job.identity.fields) if job.identity else {}),
                hint="its slot is free but its process runs on: stop it before any retry of this job",
            )
        if found.handle is not None and found.liveness is not Liveness.ALIVE:
            await self.boot.executor.release(found.handle)  # a never-started container, say
        return _Done(str(decision.status), changed=True, still_running=still_running)

    async def _finish(self, job: Job, exit_status: ExitStatus | None, found: Evidence) -> _Done:
        """A job's end by its recorded exit (or none: lost), as its monitor would have recorded it (``ending``)."""
        if not await self.monitors.finish(job, exit_status, cancel_asked=False, expect=job):
            return _UNTOUCHED
        action = str((await self.boot.registry.get(job.job_id)).status)
        if found.handle is not None:
            await self.boot.executor.release(found.handle)
        return _Done(action, changed=True)

    async def _requeue(self, job: Job, decision: Decision, found: Evidence) -> _Done:
        # INV-IDENTITY-BEFORE-PROGRAM: it provably never started; back to the head of the queue, the start
        # not counted (ADR 0009), only if the row is still that unstarted attempt.
        boot = self.boot
        change = await boot.registry.requeue(job.job_id, expect=Expect(job.identity), reason=decision.reason)
        if not change.changed:
            return _UNTOUCHED
        boot.announce(change.job, str(change.previous), decision.reason)
        if found.handle is not None:
            await boot.executor.release(found.handle)  # a container created and never started, say
        return _Done("requeued", changed=True)

    async def stop_stalled(self, job: Job) -> None:
        """stall_action = terminate: stop a stalled job whose process is verified alive, as a cancel does; it ends
        ``stale`` / ``progress_stalled`` (``stop``)."""
        await self.stop(job, STOP_STALL)

    async def stop_past_deadlines(self) -> None:
        """Stop each of this host's running jobs whose kind's ``deadline_seconds`` has passed since its attempt's
        recorded start (``started_at``: it holds across a restart and for an adopted job); it ends failed /
        ``deadline_exceeded`` once its process is gone (``stop``)."""
        boot = self.boot
        deadlines = boot.kinds.deadlines()
        if not deadlines:
            return
        now = boot.wall_clock()
        for job in await boot.registry.running_jobs():
            limit = deadlines.get(job.kind)
            if limit is None or job.started_at is None or not boot.owns(job):
                continue  # INV-OWNER-JUDGES: another host's process is that host's to stop
            if (now - job.started_at).total_seconds() > limit:
                await self.stop(job, STOP_DEADLINE)

    async def stop(self, job: Job, why: str) -> None:
        """Stop a job for ``why`` (``STOPS``) whose process is verified alive, as a cancel does: SIGTERM, SIGKILL
        after the grace, through the identity-verified path only (INV-NEVER-BLIND-SIGNAL).

        The row stays RUNNING (and holds its slot) until the job's monitor sees the process gone; only then is it
        finalized with that stop's outcome. A job whose liveness cannot be verified now is never signalled: said,
        and tried again at the next sweep (INV-UNKNOWN-KEEPS-SLOT). The reason is on the row before the signal
        (``Registry.request_stop``), so a boot that dies in the grace leaves the next one to end the job as planned;
        a row the write cannot reach is not signalled now (the next sweep tries again).
        """
        boot = self.boot
        if boot.ledger.stopping_for(job.job_id) is not None:
            return
        what = "stalled_job" if why == STOP_STALL else "deadline_job"
        watched = boot.ledger.entry(job.job_id)
        adopt: JobHandle | None = None
        if watched is None:
            # Not watched by this boot (a prior boot's job): stopped only once the executor verifies it alive now.
            [found] = await self.monitors.evidence([job])
            if found.handle is None or found.liveness is not Liveness.ALIVE or not boot.tree.attached:
                # Unless its monitor ended it since the rows were read (nothing to stop then, and nothing to say).
                if (await boot.registry.get(job.job_id)).status is JobStatus.RUNNING:
                    log.warning(f"{what}_not_terminated", job_id=job.job_id, why="no verified live process")
                return
            adopt = found.handle
        # INV-STOP-REASON-BEFORE-SIGNAL: recorded before any signal, so whichever boot records the end finishes it as
        # this stop planned (a deadline's: never resubmitted), even when this one dies in the grace.
        recorded = (await boot.registry.request_stop(job.job_id, why, expect=Expect(job.identity))).job
        if recorded.status is not JobStatus.RUNNING or recorded.identity != job.identity:
            return  # it ended (or runs as another attempt) since the rows were read: nothing of this one to stop
        why = recorded.stop_reason or why  # a stop already recorded keeps its reason (the first stands)
        if not boot.ledger.stop_for(job.job_id, why):
            return  # another stop of it began meanwhile (this boot's adoption of a recorded one)
        what = "stalled_job" if why == STOP_STALL else "deadline_job"
        log.warning(f"{what}_terminating", job_id=job.job_id, grace_s=boot.config.cancel_grace_s)
        if watched is not None:
            watched.request_cancel()  # its monitor: SIGTERM, SIGKILL after the grace, then finalize once it is gone
        elif adopt is not None:
            await self.monitors.adopt(job, adopt, cancel=True)

    async def release_leftovers(self) -> bool:
        """Release what the executor still holds of attempts whose end this registry records: a container a dead boot
        finalized and never removed (INV-RELEASE-AFTER-END). Another supervisor's (a job not in this registry) and
        any attempt not recorded as ended are left alone. False when the executor cannot tell now (ask again later).
        """
        boot = self.boot
        found = await trio.to_thread.run_sync(boot.executor.leftovers)
        if found is None:
            return False
        for leftover in found:
            try:
                job = await boot.registry.get(leftover.job_id)
            except JobNotFound:
                continue
            if attempt_ended(job, leftover.attempt):
                await boot.executor.release(leftover.handle)
                fields = leftover.handle.log_fields()
                log.info("leftover_released", job_id=job.job_id, attempt=leftover.attempt, **fields)
        return True
