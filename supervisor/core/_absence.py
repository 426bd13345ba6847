"""Absence detection (ADR 0002 D8-D9): is a running job stalled (no progress) or silent (no heartbeats)?

The sweeper judges, never the child (INV-STALE-SET-BY-SUPERVISOR): after each reconcile, ``AbsenceJudge.judge``
looks at every RUNNING row and applies ``judge_absence``, a pure rule table like ``_core.judge``.

Time. Ages are measured on the event loop's monotonic clock (``trio.current_time``) within a boot, so a jump of
the wall clock can neither fire nor hold back a rule (INV-ABSENCE-MONOTONIC). The tracker notes the monotonic time
at which it saw each change: a promotion (from the event bus), a heartbeat (the core tells it as the beat is
recorded), or a stored timestamp that changed without it (a change another process made: seen at this sweep, so
never judged older than it is). Only a job first seen by this boot (a prior boot's) is aged from the stored wall
clock timestamps, once, at first sight.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

import trio

from ..domain import Config, Job, JobStatus
from ..domain._model import Liveness, utc_now
from ..observe import EventBus, EventName, JobEvent, get_logger
from ..registry import Registry
from ._rules import REASON_RECOVERED, REASON_SILENT, REASON_STALLED, Signals, Verdict, judge_absence

log = get_logger()


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

    def keep_only(self, job_ids: set[str]) -> None:
        for job_id in set(self._seen) - job_ids:
            del self._seen[job_id]

    def _observe(self, job: Job) -> _Seen:
        now = self._clock()
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
        """A job this boot has not seen start (a prior boot's): its ages come from the stored wall-clock stamps."""
        wall = self.wall_clock()

        def mono(at: datetime | None) -> float | None:
            # max(0, ...): a stamp "in the future" (the wall clock stepped back) counts as now, never as younger.
            return None if at is None else now - max(0.0, (wall - at).total_seconds())

        progress_at = mono(job.last_progress_at or job.started_at)
        return _Seen(
            job.last_progress_at,
            now if progress_at is None else progress_at,
            job.last_heartbeat_at,
            mono(job.last_heartbeat_at),
        )


StopStalled = Callable[[Job], Awaitable[None]]


class AbsenceJudge:
    """Runs the absence rules over the running rows at each sweep, records changes, announces them."""

    def __init__(
        self,
        config: Config,
        registry: Registry,
        events: EventBus,
        boot_id: str,
        stop_stalled: StopStalled,
        tracker: AbsenceTracker | None = None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.events = events
        self.boot_id = boot_id
        self.stop_stalled = stop_stalled
        self.tracker = tracker or AbsenceTracker()
        events.subscribe(self.tracker.on_event)

    async def judge(self, liveness: Mapping[str, Liveness | None]) -> None:
        """One pass over the running rows; ``liveness`` is this sweep's reconcile evidence, by job id."""
        # ADR 0012: another host's jobs beat to that host; their absence is that host's to judge.
        host_id = self.config.host_id
        rows = [job for job in await self.registry.running_jobs() if job.host_id in (None, host_id)]
        self.tracker.keep_only({job.job_id for job in rows})
        for job in rows:
            signals = self.tracker.signals(job, liveness.get(job.job_id))
            verdict = judge_absence(
                signals,
                stale_after_s=self.config.progress_stale_after_s,
                silent_after_s=self.config.silent_after_s,
                action=self.config.stall_action,
            )
            if (verdict.stalled, verdict.silent) != (job.stalled, job.silent):
                await self._record(job, verdict, signals)
            if verdict.terminate:
                await self.stop_stalled(job)
            elif verdict.stalled and self.config.stall_action == "terminate" and not signals.stalled:
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
        result = await self.registry.set_absence(
            job.job_id, stalled=verdict.stalled, silent=verdict.silent, events=named
        )
        if not result.changed:
            return  # ended (or judged by another process) meanwhile
        extra = {
            "progress_age_s": round(signals.progress_age_s, 3),
            "heartbeat_age_s": None if signals.heartbeat_age_s is None else round(signals.heartbeat_age_s, 3),
        }
        for name, reason in named:
            self.events.emit(JobEvent(EventName(name), result.job, str(JobStatus.RUNNING), reason, self.boot_id, extra))
