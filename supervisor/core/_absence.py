"""Absence detection (ADR 0002 D8-D9): is a running job stalled (no progress) or silent (no heartbeats)?

The sweeper judges, never the child (INV-STALE-SET-BY-SUPERVISOR): after each reconcile, ``AbsenceJudge.judge``
looks at every RUNNING row and applies ``judge_absence``, a pure rule table like ``_core.judge``.

Time. Ages are measured on the event loop's monotonic clock (``trio.current_time``) within a boot, so a jump of
the wall clock can neither fire nor hold back a rule (INV-ABSENCE-MONOTONIC). The tracker notes the monotonic time
at which it saw each change: a promotion (from the event bus), a heartbeat (the core tells it as the beat is
recorded), or a stored timestamp that changed without it (a change another process made: seen at this sweep, so
never judged older than it is). Only a job first seen by this boot (a prior boot's) is aged from the stored wall
clock timestamps, once, at first sight.

The supervisor's own absence never counts against a job (INV-OWN-ABSENCE-NOT-THE-JOBS). While this process is down
(a restart, an upgrade) or frozen (SIGSTOP, swapped out), no beat can be taken, so the stored stamps grow old through
no fault of the job. Two rules keep that time out of every age:
- a job first seen by this boot is aged from the later of its stored stamp and this boot's first look, unless its row
  was already flagged (then its stored stamps keep it flagged until it beats or progresses): a job truly stalled
  before the outage is flagged within its threshold plus one sweep of the new boot, never at the new boot's first
  sweep for time it could not have reported;
- within a boot, a check-in task notes this process's presence every ``CHECK_IN_S``; a gap longer than
  ``ABSENT_AFTER_S`` between two check-ins (or before a judgement) is this process's absence, and every job's clocks
  move forward by it (``supervisor_was_absent``, a WARNING).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import trio

from ..domain import Job, JobStatus, Liveness, utc_now
from ..observe import EventName, JobEvent, get_logger
from ._boot import Boot
from ._ports import StallStops
from ._rules import REASON_RECOVERED, REASON_SILENT, REASON_STALLED, Signals, Verdict, judge_absence

log = get_logger()

# How often this process notes its own presence, and the gap between two notes that counts as its absence (a loop
# busy for under a second or two is not absent: the jobs' beats still reach it).
CHECK_IN_S = 0.5
ABSENT_AFTER_S = 2.0


@dataclass
class _Seen:
    progress_stamp: datetime | None  # last_progress_at as last seen (None: no progress yet)
    progress_at: float  # monotonic time of the last progress (or of the start)
    beat_stamp: datetime | None  # last_heartbeat_at as last seen
    beat_at: float | None  # monotonic time of the last heartbeat; None: none yet


class AbsenceTracker:
    """The monotonic time at which this boot saw each running job's progress and heartbeats move."""

    def __init__(
        self,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._clock = clock
        # The wall clock, read only to age a job first seen by this boot from its stored stamps (a test seam).
        self.wall_clock = wall_clock or utc_now
        self._seen: dict[str, _Seen] = {}
        self._first_look: float | None = None  # when this boot first looked at a job (its start, for its rows)
        self._checked_in: float | None = None  # the last check-in of this process (None: no check-in task runs)
        self.absent_s = 0.0  # this process's absence, in total, that no job's age counts

    def on_event(self, event: JobEvent) -> None:
        """Bus subscriber: a promotion starts the job's clocks now; an ended (or resubmitted) job is forgotten."""
        job = event.job
        if event.event is EventName.TRANSITION and job.status is JobStatus.RUNNING:
            self._seen[job.job_id] = _Seen(job.last_progress_at, self._clock(), job.last_heartbeat_at, None)
        elif job.status is not JobStatus.RUNNING:
            self._seen.pop(job.job_id, None)

    def beat(self, job: Job) -> None:
        """A heartbeat was just recorded (``job`` is the row after it): progress moved if its stamp did."""
        seen = self._observe(job)
        now = self._clock()
        seen.beat_stamp, seen.beat_at = job.last_heartbeat_at, now
        if job.last_progress_at != seen.progress_stamp:
            seen.progress_stamp, seen.progress_at = job.last_progress_at, now

    def signals(self, job: Job, liveness: Liveness | None) -> Signals:
        seen = self._observe(job)
        now = self._clock()
        return Signals(
            progress_age_s=now - seen.progress_at,
            heartbeat_age_s=None if seen.beat_at is None else now - seen.beat_at,
            liveness=liveness,
            stalled=job.stalled,
            silent=job.silent,
        )

    def check_in(self) -> float:
        """Note that this process is here now; return the absence found since the last check-in (0.0 if none),
        which no job's age counts (INV-OWN-ABSENCE-NOT-THE-JOBS). Only once a check-in task runs (``keep_checking_in``)
        is a gap an absence: a judgement alone cannot tell a frozen process from a long wait between sweeps."""
        if self._checked_in is None:
            return 0.0
        now = self._clock()
        last, self._checked_in = self._checked_in, now
        if now - last <= ABSENT_AFTER_S:
            return 0.0
        gap = now - last
        self.absent_s += gap
        for seen in self._seen.values():
            seen.progress_at = min(now, seen.progress_at + gap)
            if seen.beat_at is not None:
                seen.beat_at = min(now, seen.beat_at + gap)
        return gap

    def begin_check_ins(self) -> None:
        """From now on a gap between two check-ins past ``ABSENT_AFTER_S`` is an absence (``keep_checking_in`` calls
        it as it starts)."""
        self._checked_in = self._clock()

    async def keep_checking_in(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The check-in task (root nursery): notes this process's presence every ``CHECK_IN_S``, and says an absence
        it finds. Error boundary: none needed, it only reads the clock."""
        self.begin_check_ins()
        task_status.started()
        try:
            while True:
                await trio.sleep(CHECK_IN_S)
                self.note_presence()
        finally:
            self._checked_in = None

    def note_presence(self) -> None:
        """``check_in``, and say the absence it found, if any."""
        gap = self.check_in()
        if gap:
            log.warning(
                "supervisor_was_absent",
                absent_s=round(gap, 3),
                effect="the running jobs' progress and heartbeat ages do not count it",
            )

    def keep_only(self, job_ids: set[str]) -> None:
        for job_id in set(self._seen) - job_ids:
            del self._seen[job_id]

    def _observe(self, job: Job) -> _Seen:
        now = self._clock()
        if self._first_look is None:
            self._first_look = now
        seen = self._seen.get(job.job_id)
        if seen is None:
            seen = self._seen[job.job_id] = self._first_sight(job, now)
            return seen
        # A stamp that moved without this process seeing it (another process recorded it): seen now, never older.
        if job.last_progress_at != seen.progress_stamp:
            seen.progress_stamp, seen.progress_at = job.last_progress_at, now
        if job.last_heartbeat_at != seen.beat_stamp:
            seen.beat_stamp, seen.beat_at = job.last_heartbeat_at, now
        return seen

    def _first_sight(self, job: Job, now: float) -> _Seen:
        """A job this boot has not seen start (a prior boot's): its ages come from the stored wall-clock stamps, but
        none is older than this boot's first look unless the row was flagged for it (INV-OWN-ABSENCE-NOT-THE-JOBS:
        the time no supervisor could take a beat is not the job's)."""
        wall = self.wall_clock()
        since = self._first_look if self._first_look is not None else now

        def mono(at: datetime | None, flagged: bool) -> float | None:
            if at is None:
                return None
            # max(0, ...): a stamp "in the future" (the wall clock stepped back) counts as now, never as younger.
            at_mono = now - max(0.0, (wall - at).total_seconds())
            return at_mono if flagged else max(at_mono, since)

        progress_at = mono(job.last_progress_at or job.started_at, job.stalled)
        return _Seen(
            job.last_progress_at,
            now if progress_at is None else progress_at,
            job.last_heartbeat_at,
            mono(job.last_heartbeat_at, job.silent),
        )


class RunningRows(Protocol):
    async def running_jobs(self) -> list[Job]: ...


class AbsenceJudge:
    """Runs the absence rules over the running rows at each sweep, records changes, announces them."""

    def __init__(self, boot: Boot, reconciler: StallStops, tracker: AbsenceTracker, rows: RunningRows) -> None:
        """``reconciler``: stops a stalled job (``stall_action = "terminate"``); ``tracker``: the ages it judges by
        (told of promotions by the event bus: ``Supervisor`` subscribes it); ``rows``: where the running rows are read
        as of now, the beats taken included (``CurrentRows``)."""
        self.boot = boot
        self._reconciler = reconciler
        self.tracker = tracker
        self.rows = rows

    async def judge(self, liveness: Mapping[str, Liveness | None]) -> None:
        """One pass over the running rows; ``liveness`` is this sweep's reconcile evidence, by job id."""
        # ADR 0012: another host's jobs beat to that host; their absence is that host's to judge.
        host_id = self.boot.config.host_id
        # A freeze ended just now is seen before any age is (the check-in task may not have run since it ended).
        self.tracker.note_presence()
        rows = [job for job in await self.rows.running_jobs() if job.host_id in (None, host_id)]
        self.tracker.keep_only({job.job_id for job in rows})
        for job in rows:
            signals = self.tracker.signals(job, liveness.get(job.job_id))
            verdict = judge_absence(
                signals,
                stale_after_s=self.boot.config.progress_stale_after_s,
                silent_after_s=self.boot.config.silent_after_s,
                action=self.boot.config.stall_action,
            )
            if (verdict.stalled, verdict.silent) != (job.stalled, job.silent):
                await self._record(job, verdict, signals)
            if verdict.terminate:
                await self._reconciler.stop_stalled(job)
            elif verdict.stalled and self.boot.config.stall_action == "terminate" and not signals.stalled:
                log.warning(
                    "stalled_job_not_terminated",
                    job_id=job.job_id,
                    liveness=signals.liveness.value if signals.liveness else None,
                    why="its process is not verified alive; the slot is kept (INV-UNKNOWN-KEEPS-SLOT)",
                )

    async def _record(self, job: Job, verdict: Verdict, signals: Signals) -> None:
        reasons = {str(EventName.STALLED): REASON_STALLED, str(EventName.SILENT): REASON_SILENT}
        named = [(name, reasons.get(name, REASON_RECOVERED)) for name in verdict.events]
        # The row's flags and their outbox events commit together.
        result = await self.boot.registry.set_absence(
            job.job_id, stalled=verdict.stalled, silent=verdict.silent, events=named
        )
        if not result.changed:
            return  # ended (or judged by another process) meanwhile
        extra = {
            "progress_age_s": round(signals.progress_age_s, 3),
            "heartbeat_age_s": None if signals.heartbeat_age_s is None else round(signals.heartbeat_age_s, 3),
        }
        for name, reason in named:
            event = JobEvent(EventName(name), result.job, str(JobStatus.RUNNING), reason, self.boot.boot_id, extra)
            self.boot.events.emit(event)
