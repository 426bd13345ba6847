"""One monitor task per running job, and cancel.

A monitor waits for its job's end (``Executor.wait``), finalizes the row with the job's true outcome
(INV-TRUE-OUTCOME), lets the executor forget the job, and wakes the drainer for the slot it freed. It runs in the
job nursery; cancelling it (a shutdown) stops the watching, never the job: the job belongs to the shepherd or the
engine, and the next boot adopts it.

A cancel of a job this boot watches is carried out by a short task (``_carry_out_cancel``: SIGTERM, the grace
period, SIGKILL; ``docker stop`` in docker mode) that its monitor ends when the job ends. A cancel never sends a
blind signal (INV-NEVER-BLIND-SIGNAL): a job nobody here watches is adopted first, and only once the executor has
verified its identity.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any

import trio

from ..domain import RESUBMITTED, ExitStatus, Job, JobStatus, Liveness, SupervisorError
from ..execution import Evidence, JobHandle, Unwatchable
from ..observe import EventName, JobEvent, get_logger
from ..registry import Ending, Expect, IdentityClaim, Outcome
from ._boot import Boot, until_recorded
from ._ledger import Watched
from ._ports import BeatsWriter, DrainBell, FollowUps
from ._rules import JITTER, RetryPolicy, ending

log = get_logger()


# A job's end that the registry could not write is written again after these waits (doubling).


class Monitors:
    """The monitors of the jobs this boot watches, and cancel. ``drain_bell``: rung when a slot was freed;
    ``follow_ups``: the job a kind's ``then`` enqueues after a success (with the success, in one registry step), and
    its announcement on the event bus (``Enqueuer``); ``beats``: the heartbeats taken and not yet written, written
    (``Heartbeats.flush``): a row that ends takes no beat after, so its last ones are written first (ADR 0018).
    ``jitter``: the generator of the draws that spread resubmissions apart (the scenario kit gives a seeded one, so
    that a scenario repeats; default: a generator of its own, since the module's shared one belongs to whoever else
    runs in this process, and a test's property-based generator notices another thread drawing from it)."""

    def __init__(
        self,
        boot: Boot,
        drain_bell: DrainBell,
        follow_ups: FollowUps,
        beats: BeatsWriter,
        *,
        jitter: random.Random | None = None,
    ) -> None:
        self.boot = boot
        self._drain_bell = drain_bell
        self._follow_ups = follow_ups
        self._beats = beats
        self.jitter = jitter if jitter is not None else random.Random()

    async def evidence(self, rows: list[Job]) -> list[Evidence]:
        """The executor's evidence for ``rows`` (``Boot.evidence``), as reconcile and a cancel ask for it."""
        return await self.boot.evidence(rows)

    async def start(self, watched: Watched, job: Job) -> None:
        """Start ``job``'s monitor in the job nursery; returns once it watches."""
        await self.boot.tree.nursery().start(self._monitor, watched, job)

    async def _monitor(self, watched: Watched, job: Job, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        handle = watched.handle
        assert handle is not None
        # The stop runs only once a cancel is asked for, in a task of its own that ends with the job: no waiting
        # task per job for a cancel that almost never comes.
        stopping = trio.CancelScope()
        nursery = self.boot.tree.nursery()

        def start_stop() -> None:
            nursery.start_soon(self._carry_out_cancel, watched, stopping)

        try:
            watched.on_cancel = start_stop
            if watched.cancel_requested:
                start_stop()
            try:
                status = await self.boot.executor.wait(handle)
            finally:
                watched.on_cancel = None
                stopping.cancel()
            await self._finish_until_recorded(job, status, cancel_asked=watched.cancel_requested, process=handle)
            await self.boot.executor.release(handle)
        except Unwatchable as exc:
            # INV-UNKNOWN-KEEPS-SLOT: the row stays RUNNING; the sweeper judges it on whatever evidence exists.
            log.warning("job_unwatchable", job_id=job.job_id, why=str(exc))
        except SupervisorError:
            # The row stays RUNNING; with no monitor left, the sweeper's rules finalize it.
            log.exception("monitor_failed", job_id=job.job_id)
        finally:
            self.boot.ledger.release(job.job_id, watched)
            self._drain_bell.ring()

    async def _finish_until_recorded(
        self, job: Job, status: ExitStatus | None, *, cancel_asked: bool, process: JobHandle
    ) -> None:
        """``finish``, again and again while the registry cannot write (a full disk, a lock held too long): the end
        of a job this boot watched is recorded once it can be, with its true outcome (INV-TRUE-OUTCOME), never
        dropped. The row keeps its slot meanwhile; the registry says once that writes fail, and once they work."""
        # Guarded by the identity this boot started or adopted: a row ended meanwhile by another's word (an operator's
        # forget, INV-FORGET-IS-FENCED) and perhaps running elsewhere now is never recorded as this process's end.
        finish = functools.partial(self.finish, job, status, cancel_asked=cancel_asked, expect=job, process=process)
        await until_recorded(finish)

    async def finish(
        self,
        job: Job,
        status: ExitStatus | None,
        *,
        cancel_asked: bool,
        expect: Job | None = None,
        orphan_reason: str | None = None,
        host_silent: bool = False,
        process: JobHandle | None = None,
    ) -> bool:
        """Finalize a job whose process has ended: its true outcome, or an orphan when no exit was recorded; a crash
        is resubmitted while its kind allows more attempts (ADR-150 D4). ``expect``: only if the row still records
        the process of this (earlier) read of it; with ``host_silent``, also only while the row's host holds no
        live lease (another host's job ended by proof: INV-SILENT-HOST-ENDS-BY-PROOF). ``process``: the handle this
        boot watched, which names the process when the row could not record it. True when this call changed the row
        (a terminal row is left alone)."""
        boot = self.boot
        kind = boot.kinds.get(job.kind) if job.kind in boot.kinds else None
        decided = ending(
            status,
            kind=kind,
            cancel_asked=cancel_asked,
            stop=boot.ledger.stopping_for(job.job_id),
            orphan_reason=orphan_reason or boot.executor.orphan_reason,
            attempts=job.attempts,
            policy=RetryPolicy.of(kind, job.max_attempts),
            now=boot.wall_clock(),
            jitter=self.jitter.uniform(*JITTER),  # spreads retries of jobs that crashed together apart
        )
        follow_up = self._follow_ups.follow_up_of(job, kind.then) if kind is not None and kind.then else None
        if follow_up is not None:
            decided = dataclasses.replace(decided, then=follow_up[0], then_key=follow_up[1])
        guard = Expect(expect.identity, host_silent=host_silent) if expect is not None else None
        await self._beats.flush()  # its last beats before its end (ADR 0018)
        change = await boot.registry.finalize(job.job_id, decided, expect=guard)
        boot.ledger.stop_done(job.job_id)
        if not change.changed:
            return False
        final = change.job
        # The line names the process whose attempt ended, as the row recorded it (the identity the guard held), or
        # as the handle names it when its identity could not be recorded: a row back in the queue forgets it.
        ended = process.log_fields() if process is not None else {}
        if job.identity is not None:
            ended = dict(job.identity.fields)
        if final.status is JobStatus.QUEUED:
            # Resubmitted: the attempt's outcome is in the row's history; the drainer starts it once its backoff
            # has passed (woken by the monitor's end, it learns when from the promotion).
            # Said as the registry chose it (the ending of a stop the row records, perhaps): the attempt it recorded.
            attempt = final.history[-1]
            reason = RESUBMITTED + (attempt.reason or str(attempt.status))
            boot.announce(final, str(change.previous), reason, exit_code=decided.exit_code, **ended)
            return True
        boot.announce_end(final, change.previous, **ended)
        if change.follow_up is not None:
            self._follow_ups.announce([change.follow_up])  # it wakes the drainer
            follow = change.follow_up
            log.info("follow_up_enqueued", job_id=job.job_id, follow_up=follow.job.job_id, coalesced=follow.coalesced)
        return True

    async def finalize(self, job: Job, outcome: Outcome, *, expect: Job | None = None) -> bool:
        """End a RUNNING row with a decided outcome (reconcile's verdicts, a cancel of a job left alone)."""
        guard = Expect(expect.identity) if expect is not None else None
        await self._beats.flush()  # its last beats before its end (ADR 0018)
        change = await self.boot.registry.finalize(job.job_id, Ending(outcome), expect=guard)
        if change.changed:
            self.boot.announce_end(change.job, change.previous)
        return change.changed

    async def _carry_out_cancel(self, watched: Watched, scope: trio.CancelScope) -> None:
        """Stop a job whose cancel was requested; ``scope`` is cancelled by its monitor once the job has ended."""
        assert watched.handle is not None
        if scope.cancel_called:
            return  # the job ended before this task first ran: nothing to stop, and nothing to log
        with scope:
            try:
                await self.boot.executor.stop(watched.handle, self.boot.config.cancel_grace_s)
            except SupervisorError:
                # The monitor goes on waiting for the job's end; the cancel stays requested on the row.
                log.exception("job_stop_failed", job_id=watched.job_id)

    async def adopt(self, job: Job, handle: JobHandle, *, cancel: bool = False) -> None:
        """Watch a job this boot did not start (a prior boot's): its monitor finalizes it with its true outcome."""
        ledger = self.boot.ledger
        if job.stop_reason is not None:
            # INV-STOP-REASON-BEFORE-SIGNAL: a stop a prior boot began is carried on, as a pending cancel is (its
            # grace anew); the row's reason decides its end.
            cancel = True
            ledger.stop_for(job.job_id, job.stop_reason)
        entry = ledger.adopt(job.job_id, handle)  # before the first await: a second adoption meanwhile finds it
        if entry is None:  # watched already: that entry stays the authority
            existing = ledger.entry(job.job_id)
            if cancel and existing is not None:
                existing.request_cancel()
            return
        if cancel:
            entry.request_cancel()
        try:
            await self._announce_adopted(job, handle)
            await self.start(entry, job)
        except BaseException:
            # Cancelled (or failed) before its monitor watches: the entry must not look watched, or no reconcile
            # would ever judge the row again. The next one adopts it (a pending cancel or stop is on the row).
            ledger.release(job.job_id, entry)
            ledger.stop_done(job.job_id)
            raise

    async def _announce_adopted(self, job: Job, handle: JobHandle) -> None:
        try:
            job = await self.boot.registry.record_event(job.job_id, str(EventName.ADOPTED), "adopted")
        except SupervisorError:
            log.exception("adoption_event_not_recorded", job_id=job.job_id)  # the adoption itself goes on
        if job.status.is_terminal:
            return  # ended meanwhile (its monitor only waits for the process and releases it): its end was said last
        extra = {"prior_boot": job.boot_id, **handle.log_fields()}
        self.boot.events.emit(JobEvent(EventName.ADOPTED, job, str(job.status), "adopted", self.boot.boot_id, extra))

    # -- cancel -------------------------------------------------------------------------------------------

    async def cancel(self, job_id: str, by: str | None = None) -> Job:
        """Cancel a job (idempotent); ``by``: who asks. Never sends a blind signal (INV-NEVER-BLIND-SIGNAL)."""
        change = await self.boot.registry.request_cancel(job_id, by)
        job = change.job
        if job.status is JobStatus.CANCELLED and change.changed:
            self.boot.announce(job, "queued", job.error_reason)
            return job
        if job.status is not JobStatus.RUNNING:
            return job  # terminal: returned unchanged
        watched = self.boot.ledger.entry(job_id)
        if watched is not None:
            watched.request_cancel()  # the monitor stops it; in the spawn window, as soon as the start completes
            return job
        if not self.boot.owns(job):
            # ADR 0012: another host's job. The request is on the row; its host carries it out (its next sweep, or
            # a wake), and the row ends cancelled only once the job is gone there.
            return job
        if self.boot.ledger.promotion_under_way() and job.boot_id == self.boot.boot_id and not job.spawned:
            # INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING: maybe promoted by this boot's promotion still under way, its rows
            # not held yet. The request on the row is carried out by the start (its monitor stops it), by the requeue
            # that undoes it (ends it cancelled), or by reconcile if neither happens; never ended unverified here.
            return job
        await self._cancel_unmonitored(job)
        return await self.boot.registry.get(job_id)

    async def carry_out_requested_cancel(self, job: Job) -> None:
        """A cancel recorded on the row of a job this host owns (asked through another host: INV-OWNER-JUDGES),
        carried out here as the sweep would: a watched job's monitor stops it; a prior boot's job is adopted and
        stopped once verified. Either way the row ends ``cancelled`` only once the process is gone."""
        watched = self.boot.ledger.entry(job.job_id)
        if watched is not None:
            watched.request_cancel()
        elif job.boot_id != self.boot.boot_id:
            await self._cancel_unmonitored(job)
        # else: this boot's job with no monitor left (one that failed): the sweep's rules judge it.

    async def _cancel_unmonitored(self, job: Job) -> None:
        """A running row with no monitor here: a prior boot's job (or one whose monitor failed).

        A job the executor verified (alive, or ended with its exit on record) is adopted and stopped; its monitor
        finalizes it ``cancelled`` once it is gone. Anything else is never signalled.
        """
        [found] = await self.evidence([job])
        if found.liveness is Liveness.UNKNOWN and (why := await self.boot.executor.unavailable()) is not None:
            # INV-UNKNOWN-KEEPS-SLOT: the engine cannot be asked, so the job may well run on. The cancel stays
            # requested on the row (and the slot held); the first sweep that reaches the engine adopts and stops it.
            log.warning("cancel_pending_engine_unreachable", job_id=job.job_id, why=why)
            return
        if found.liveness is Liveness.UNKNOWN and not job.spawned and found.handle is None:
            # INV-UNKNOWN-KEEPS-SLOT: a prior boot's start may still be under way (its record not written yet). The
            # cancel stays requested on the row: a sweep adopts and stops the job once its record is there, or ends
            # the row cancelled_before_start once it provably never started.
            log.warning("cancel_pending_start_unconfirmed", job_id=job.job_id, detail=found.detail)
            return
        if found.found is not None:
            [job] = await self.boot.registry.record_identities([IdentityClaim(job.job_id, found.found)])
        verified = found.liveness is Liveness.ALIVE or found.exit_status is not None or found.exit_pending
        if found.handle is not None and verified:
            await self.adopt(job, found.handle, cancel=True)
            return
        if job.spawned and found.liveness is not Liveness.DEAD:
            log.error(
                "cancel_left_process_alone",
                job_id=job.job_id,
                **(dict(job.identity.fields) if job.identity else {}),
                liveness=found.liveness.value if found.liveness else None,
                detail=found.detail,
                why="the recorded process identity could not be verified; stop any surviving work by hand",
            )
        outcome = Outcome(JobStatus.CANCELLED, "cancelled_unverified_process_left_alone")
        await self.finalize(job, outcome, expect=job)
        self._drain_bell.ring()
