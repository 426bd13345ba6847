"""The rules of supervision as pure functions: no I/O, no clock, no task; each a table that the tests read as one.

- ``judge``: what reconcile does with one RUNNING row, given the evidence (ADR 0001 §3-§6, ADR 0004, ADR 0005);
- ``outcome``: what an exit status means for a kind (ADR 0002 D5);
- ``ending``: how a job whose process ended is finalized: the outcome, a stall stop, a cancel, and whether a crash
  is resubmitted (ADR-150 D4), given as data to the registry (which picks the cancel's outcome, never resubmitted,
  if the row says a cancel was requested by the time it commits, and else the end of a stop the row records);
- ``attempt_ended``: may what an executor holds of an attempt be released (INV-RELEASE-AFTER-END);
- ``judge_absence``: stalled / silent (ADR 0002 D8-D9).

Invariant names (``INV-...``) are the decision records'; the comments say where each is upheld.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from ..domain import ExitStatus, Job, JobKind, JobStatus, Liveness, StallAction
from ..registry import Ending, Outcome, Retry

CANCELLED = Outcome(JobStatus.CANCELLED, "cancelled")
STALLED_STOP = Outcome(JobStatus.STALE, "progress_stalled")
# A kind's deadline_seconds passed (the attempt's recorded start + the deadline): stopped, and never resubmitted.
DEADLINE_STOP = Outcome(JobStatus.FAILED, "deadline_exceeded")
# Why the supervisor stops a job itself (``JobLedger.stop_for``), and the outcome it then ends with.
STOP_STALL, STOP_DEADLINE = "stall", "deadline"
STOPS = {STOP_STALL: STALLED_STOP, STOP_DEADLINE: DEADLINE_STOP}

Action = Literal["finalize", "finalize_exit", "finalize_lost", "requeue", "keep", "untouched"]
NEVER_STARTED = "never_started"
# A start the executor's engine could not make (it does not answer), of which nothing runs: the job waits in the queue.
ENGINE_UNAVAILABLE = "engine_unavailable"


@dataclass(frozen=True)
class Decision:
    """What reconcile does with one RUNNING row."""

    # finalize_exit: the recorded exit status decides (``ending``); finalize_lost: gone with nothing recorded
    # (``ending`` with no exit status: an orphan, resubmitted while attempts remain); requeue: it never started
    action: Action
    status: JobStatus | None = None
    reason: str = ""
    warn: bool = False
    adopt: bool = False  # start a monitor for a live job nobody here watches (a prior boot's, usually)


def judge(
    job: Job,
    *,
    this_boot: bool,
    monitored: bool,
    liveness: Liveness | None,
    past_window: bool,
    stale_marks_live_processes: bool,
    exit_recorded: bool = False,
    exit_pending: bool = False,
    starting: bool,
    orphan_reason: str,
) -> Decision:
    """The reconcile rules as one pure function.

    ``exit_recorded``: how the job ended is on record (its shepherd's exit file, the engine's exit code).
    ``exit_pending``: it is gone but that record is about to be written (its shepherd still runs). ``starting``: this
    boot is starting it now (promoted, its start not yet answered: ``JobLedger.being_started``). ``orphan_reason``:
    what the exec mode calls a dead job with no record. A row without a process is judged after the executor looked for
    one (a start file, a labelled container) and recorded it in the row when found.
    """
    if this_boot and starting and not job.spawned:
        # INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING: this boot promoted it and is starting it right now. Bounded: a start
        # is held only until the executor answers it or its start timeout passes (then its outcome is unknown).
        return Decision("untouched", reason="spawn_window")
    if not job.spawned:
        return _judge_unstarted(job, liveness)
    # This boot's monitor is the authority on what it watches: it finalizes with the real exit status.
    if liveness is Liveness.DEAD and not monitored:
        return _judge_gone(job, exit_recorded=exit_recorded, exit_pending=exit_pending, orphan_reason=orphan_reason)
    adopt = liveness is Liveness.ALIVE and not monitored
    if past_window:
        if stale_marks_live_processes:
            # Only an operator evicts a live job: this path is the manual reconcile route.
            return Decision("finalize", JobStatus.STALE, "wall_clock_stale")
        # INV-SWEEP-NEVER-EVICTS-LIVE: an unattended sweep only warns.
        return Decision("keep", reason="wall_clock_exceeded_kept_alive", warn=True, adopt=adopt)
    if liveness is Liveness.UNKNOWN and not monitored:
        # INV-UNKNOWN-KEEPS-SLOT: absence of evidence is not evidence of death.
        return Decision("keep", reason="liveness_unknown_kept", warn=True)
    if adopt:
        return Decision("keep", reason="adopted", adopt=True)
    return Decision("keep", reason="alive")


def _judge_unstarted(job: Job, liveness: Liveness | None) -> Decision:
    """A row with no process recorded: a prior boot's start, or one of this boot's whose outcome is unknown (it timed
    out; the drain that made it was cancelled): judged on the executor's evidence, never assumed either way."""
    if liveness is Liveness.UNKNOWN:
        # INV-UNKNOWN-KEEPS-SLOT: the start may still happen (a shepherd that has not answered; an engine that
        # could not be asked whether a container was ever made for it).
        return Decision("keep", reason="liveness_unknown_kept", warn=True)
    # INV-IDENTITY-BEFORE-PROGRAM: no start record, and no start still in flight, so the program provably never
    # ran: it goes back to the head of the queue, its start not counted (ADR 0009).
    if job.cancel_requested:
        return Decision("finalize", JobStatus.CANCELLED, "cancelled_before_start")
    return Decision("requeue", reason=NEVER_STARTED)


def _judge_gone(job: Job, *, exit_recorded: bool, exit_pending: bool, orphan_reason: str) -> Decision:
    """A process verified dead that no monitor of this boot watches."""
    if exit_recorded:
        # INV-TRUE-OUTCOME: how it ended is on record (reaped by its shepherd, kept by the engine): that, not a
        # guess, is the outcome.
        return Decision("finalize_exit", reason="exit_recorded")
    if exit_pending:
        return Decision("keep", reason="exit_being_recorded", adopt=True)
    if job.cancel_requested:
        return Decision("finalize", JobStatus.CANCELLED, "cancelled")  # asked to stop, and it is gone
    return Decision("finalize_lost", JobStatus.FAILED, orphan_reason)


def outcome(
    status: ExitStatus,
    *,
    exit_reasons: Mapping[int, str],
    failure_reasons: Mapping[int, str] | None = None,
) -> Outcome:
    """What an exit means, for a kind that names some exit codes."""
    if status.oom_killed:
        # The engine names the OOM killer; any other 128 + N is a plain exit code (see execution/docker.py).
        return Outcome(JobStatus.FAILED, "killed_out_of_memory")
    if status.signal is not None:
        try:
            name = signal.Signals(status.signal).name
        except ValueError:
            name = f"signal_{status.signal}"
        return Outcome(JobStatus.FAILED, f"killed_by_{name}")
    code = status.code
    assert code is not None
    if code == 0:
        return Outcome(JobStatus.SUCCEEDED)
    if code in exit_reasons:
        # INV-BUDGET-IS-AN-OUTCOME: a planned stop (budget spent) is not a crash.
        return Outcome(JobStatus.SUCCEEDED, exit_reasons[code])
    if failure_reasons and code in failure_reasons:
        return Outcome(JobStatus.FAILED, failure_reasons[code])
    return Outcome(JobStatus.FAILED, f"exit_code_{code}")


@dataclass(frozen=True)
class RetryPolicy:
    """When a crashed job is resubmitted (its kind's settings, ADR-150 D4): at most ``max_attempts`` starts in all;
    the n-th resubmission waits ``backoff_s`` * 2^(n-1), at most ``backoff_max_s``, times a jitter near 1; an exit
    code in ``retry_on_exit_codes`` means "try again" too."""

    max_attempts: int = 1
    backoff_s: float = 60.0
    backoff_max_s: float = 3600.0
    retry_on_exit_codes: frozenset[int] = frozenset()

    @classmethod
    def of(cls, kind: JobKind | None, max_attempts: int) -> RetryPolicy:
        """The policy of a row: the starts its kind allowed when it was enqueued (``max_attempts``, on the row), the
        backoff and exit codes its kind declares now."""
        if kind is None:
            return cls(max_attempts=max_attempts)
        return cls(max_attempts, kind.retry_backoff_s, kind.retry_backoff_max_s, frozenset(kind.retry_on_exit_codes))


NO_RETRY = RetryPolicy()
JITTER = (0.9, 1.1)  # the factor a backoff is multiplied by: a random draw within this, made by the caller


def backoff_s(attempts: int, policy: RetryPolicy, jitter: float) -> float:
    """The wait before the next start of a job that has had ``attempts`` starts (1 after its first)."""
    base = policy.backoff_s * 2 ** min(64, max(0, attempts - 1))
    return min(policy.backoff_max_s, base) * jitter


def ending(
    status: ExitStatus | None,
    *,
    kind: JobKind | None,
    cancel_asked: bool,
    stop: str | None,
    orphan_reason: str,
    attempts: int = 1,
    policy: RetryPolicy = NO_RETRY,
    now: datetime | None = None,
    jitter: float = 1.0,
) -> Ending:
    """How a job whose process ended is finalized.

    ``status`` None: gone, and nothing recorded how it ended (its shepherd was killed, its container removed): never
    a guess, an orphan. ``cancel_asked``: this boot stopped it for a cancel. ``stop``: the sweeper stopped it itself
    (``STOPS``): for a stall (``stall_action = terminate``) it ends stale, past its kind's deadline failed /
    ``deadline_exceeded``, unless a cancel reached the row first. In every case a cancel on the row by the time the
    end commits makes it ``cancelled``, and else a stop the row records (``Job.stop_reason``, whichever boot began
    it: ``Ending.if_stopped``) makes it that stop's end, whatever ``stop`` and the exit say.

    Resubmitted (while ``attempts`` < ``policy.max_attempts``), ``now`` + the backoff: a crash (gone with nothing
    recorded, killed by a signal the supervisor did not send, the OOM killer), a stall stop, and an exit code the
    kind lists as "try again". Never: a cancel, a deadline (a second attempt would only spend it again), a planned
    outcome (a budget), any other exit code. Not decided here:
    a spawn failure and an operator's stale mark end the row with their own outcome, never resubmitted.
    """
    exit_code = status.returncode if status is not None else None
    # INV-STOP-REASON-BEFORE-SIGNAL: the end of each stop the row may record (any boot's), which the registry picks
    # at commit as it picks a cancel's: a stop cut off by a restart ends as it was planned, never as its exit says.
    stops = {
        why: Ending(
            planned,
            if_cancel_requested=CANCELLED,
            exit_code=exit_code,
            retry=_retry(why == STOP_STALL, planned, attempts, policy, now, jitter),  # a deadline's: never
        )
        for why, planned in STOPS.items()
    }
    if cancel_asked and stop is None:
        return Ending(CANCELLED, exit_code=exit_code, if_stopped=stops)
    if stop is not None:
        return replace(stops[stop], if_stopped=stops)
    if status is None:
        chosen, crash = Outcome(JobStatus.FAILED, orphan_reason), True
    else:
        chosen = outcome(
            status,
            exit_reasons=kind.exit_reasons if kind else {},
            failure_reasons=kind.failure_reasons if kind else {},
        )
        # A listed exit code is "try again" only as a failure: never a success or a planned stop (a budget).
        retryable = chosen.status is JobStatus.FAILED and status.code in policy.retry_on_exit_codes
        crash = status.oom_killed or status.signal is not None or retryable
    retry = _retry(crash, chosen, attempts, policy, now, jitter)
    return Ending(chosen, if_cancel_requested=CANCELLED, exit_code=exit_code, retry=retry, if_stopped=stops)


def _retry(
    crash: bool, chosen: Outcome, attempts: int, policy: RetryPolicy, now: datetime | None, jitter: float
) -> Retry | None:
    """A crash's resubmission while attempts remain (ADR-150 D4: kill and resubmit, bounded by the attempt count; the
    poison-pill memo makes it safe), ``now`` + the backoff; None otherwise."""
    if not crash or attempts >= policy.max_attempts or now is None:
        return None
    return Retry(now + timedelta(seconds=backoff_s(attempts, policy, jitter)), chosen.reason or str(chosen.status))


def attempt_ended(job: Job, attempt: int) -> bool:
    """Does the row record the end of ``attempt`` (1 for the first start)? Then what an executor still holds of it (a
    stopped container) may be released.

    INV-RELEASE-AFTER-END: an attempt's container is removed only once the row records how that attempt ended (the
    engine's exit code is the evidence until then), and then always, even when the boot that recorded it died
    before removing it. Ended: every attempt of a terminal row, and each earlier attempt in the history of a row
    that was resubmitted (queued again, or running a later attempt).
    """
    return job.status.is_terminal or 1 <= attempt <= len(job.history)


def past_window(started_at: datetime | None, now: datetime, stale_after_s: float | None) -> bool:
    """The wall-clock rule (ADR 0001 §6): has the job run longer than ``stale_after_s``? (None: never.)"""
    if stale_after_s is None or started_at is None:
        return False
    return now - started_at > timedelta(seconds=stale_after_s)


# -- absence (ADR 0002 D8-D9) ---------------------------------------------------------------------------

REASON_STALLED = "progress_stalled"
REASON_SILENT = "heartbeat_silent"
REASON_RECOVERED = "absence_cleared"


@dataclass(frozen=True)
class Signals:
    """What the sweeper knows of one running job's signals, now."""

    progress_age_s: float  # since the watermark last rose, or since the job started
    heartbeat_age_s: float | None  # since the last heartbeat; None: the job never sent one
    liveness: Liveness | None  # this sweep's evidence (None: not probed this sweep)
    stalled: bool  # the row's flags as they stand
    silent: bool


@dataclass(frozen=True)
class Verdict:
    stalled: bool
    silent: bool
    events: tuple[str, ...]  # event names, in the order they are announced (see ``observe.EventName``)
    terminate: bool  # stop the job now (stall_action = terminate)


def judge_absence(
    signals: Signals,
    *,
    stale_after_s: float | None,
    silent_after_s: float | None,
    action: StallAction,
) -> Verdict:
    """The absence rules as one pure function. ``None`` thresholds are disabled."""
    # INV-PROGRESS-NOT-LIVENESS: stalled depends on the progress watermark alone; a beat without progress is no
    # progress. Strictly past the threshold: judged at the first sweep after it, never at or before it.
    stalled = stale_after_s is not None and signals.progress_age_s > stale_after_s
    beats_stopped = (
        silent_after_s is not None
        and signals.heartbeat_age_s is not None  # a job that never beat is judged on progress age alone
        and signals.heartbeat_age_s > silent_after_s
    )
    if not beats_stopped:
        silent = False  # beats resumed (or the rule is off): the flag clears
    elif signals.liveness is Liveness.ALIVE:
        # INV-SILENT-NEEDS-A-LIVE-PROCESS: silence is news only while the process is verified alive; a dead one
        # is reconcile's to finalize.
        silent = True
    else:
        silent = signals.silent  # no evidence either way this sweep: the flag stays as it was
    events: list[str] = []
    if (signals.stalled and not stalled) or (signals.silent and not silent):
        events.append("job.recovered")
    if stalled and not signals.stalled:
        events.append("job.stalled")
    if silent and not signals.silent:
        events.append("job.silent")
    # INV-UNKNOWN-KEEPS-SLOT: only a process verified alive is ever stopped; absence of evidence never frees a slot.
    terminate = stalled and action == "terminate" and signals.liveness is Liveness.ALIVE
    return Verdict(stalled, silent, tuple(events), terminate)
