"""Kill and resubmit (ADR 0009): what is resubmitted and what never is (the pure rule), the backoff's arithmetic, and
the drainer starting a resubmitted job when its backoff ends — no sooner, and with no other wake — on a virtual
clock (the in-memory executor and registry: no thread, no real time)."""

from __future__ import annotations

import itertools
import signal
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
import trio.testing
from core_executors import PROGRAMS  # type: ignore[import-not-found]

from supervisor import Config, ExitStatus, Supervisor, load_kinds
from supervisor.core import NO_RETRY, STOP_DEADLINE, STOP_STALL, RetryPolicy, attempt_ended, backoff_s, ending
from supervisor.domain import JobKind, JobStatus
from supervisor.execution.memory import MemoryExecutor
from supervisor.observe import EventName, JobEvent
from supervisor.registry import MemoryRegistry

OOM = "killed_out_of_memory"
NOW = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
KIND = JobKind(
    "k",
    ("x",),
    exit_reasons={10: "budget_exhausted"},
    max_attempts=3,
    retry_backoff_s=60.0,
    retry_backoff_max_s=100.0,
    retry_on_exit_codes=frozenset({75, 10}),  # 10 listed too: a planned stop must still never be retried
)
POLICY = RetryPolicy.of(KIND, KIND.max_attempts)


def end(status: ExitStatus | None, *, attempts: int = 1, cancel: bool = False, stall: bool = False) -> object:
    decided = ending(
        status,
        kind=KIND,
        cancel_asked=cancel,
        stop=STOP_STALL if stall else None,
        orphan_reason="orphan_reconciled_dead_pid",
        attempts=attempts,
        policy=POLICY,
        now=NOW,
    )
    retry = decided.retry
    return (decided.outcome.status, decided.outcome.reason, None if retry is None else retry.why)


@pytest.mark.parametrize(
    ("status", "stall", "expected"),
    [
        # Crashes: resubmitted, the attempt's outcome kept as the why.
        (None, False, (JobStatus.FAILED, "orphan_reconciled_dead_pid", "orphan_reconciled_dead_pid")),
        (ExitStatus(signal=signal.SIGKILL), False, (JobStatus.FAILED, "killed_by_SIGKILL", "killed_by_SIGKILL")),
        (ExitStatus(code=137, oom_killed=True), False, (JobStatus.FAILED, "killed_out_of_memory", OOM)),
        (ExitStatus(signal=signal.SIGTERM), True, (JobStatus.STALE, "progress_stalled", "progress_stalled")),
        (ExitStatus(code=75), False, (JobStatus.FAILED, "exit_code_75", "exit_code_75")),
        # Never: another exit code, a success, a planned stop (even when the kind lists its code).
        (ExitStatus(code=7), False, (JobStatus.FAILED, "exit_code_7", None)),
        (ExitStatus(code=0), False, (JobStatus.SUCCEEDED, None, None)),
        (ExitStatus(code=10), False, (JobStatus.SUCCEEDED, "budget_exhausted", None)),
    ],
)
def test_what_is_resubmitted(status: ExitStatus | None, stall: bool, expected: object) -> None:
    assert end(status, stall=stall) == expected


@pytest.mark.parametrize(
    ("status", "earlier", "attempt", "ended"),
    [
        (JobStatus.RUNNING, 0, 1, False),  # the attempt that runs now
        (JobStatus.RUNNING, 1, 1, True),  # a resubmitted job's earlier attempt
        (JobStatus.RUNNING, 1, 2, False),
        (JobStatus.QUEUED, 1, 1, True),  # waiting out its backoff: its first attempt ended
        (JobStatus.QUEUED, 1, 2, False),  # its next start (a container created, never started): not ended
        (JobStatus.QUEUED, 0, 1, False),  # a start that never happened, requeued
        (JobStatus.SUCCEEDED, 0, 1, True),
        (JobStatus.FAILED, 2, 3, True),
        (JobStatus.CANCELLED, 0, 1, True),
    ],
)
def test_an_attempt_is_released_only_once_the_row_records_its_end(
    status: JobStatus, earlier: int, attempt: int, ended: bool
) -> None:
    # INV-RELEASE-AFTER-END: what an executor holds of an attempt (its container) goes once the row records its end.
    job = type("J", (), {"status": status, "history": (object(),) * earlier})()
    assert attempt_ended(job, attempt) is ended


def test_a_cancel_is_never_resubmitted_and_wins_over_a_crash() -> None:
    assert end(ExitStatus(signal=signal.SIGTERM), cancel=True) == (JobStatus.CANCELLED, "cancelled", None)
    # A cancel that reaches the row before the end commits: the registry picks the cancel's outcome, no retry.
    decided = ending(
        None,
        kind=KIND,
        cancel_asked=False,
        stop=None,
        orphan_reason="o",
        attempts=1,
        policy=POLICY,
        now=NOW,
    )
    assert decided.retry is not None and decided.chosen(cancel_requested=True).status is JobStatus.CANCELLED


# What the process's end says (an exit the kind retries, the SIGKILL after the grace, nothing recorded) x the stop the
# row records -> how the row ends: the stop's plan, whichever boot reads the end (a deadline: never resubmitted).
STOPPED = [
    (ExitStatus(code=75), None, (JobStatus.FAILED, "exit_code_75", "exit_code_75")),
    (ExitStatus(code=75), STOP_DEADLINE, (JobStatus.FAILED, "deadline_exceeded", None)),
    (ExitStatus(code=75), STOP_STALL, (JobStatus.STALE, "progress_stalled", "progress_stalled")),
    (ExitStatus(signal=signal.SIGKILL), STOP_DEADLINE, (JobStatus.FAILED, "deadline_exceeded", None)),
    (ExitStatus(signal=signal.SIGKILL), STOP_STALL, (JobStatus.STALE, "progress_stalled", "progress_stalled")),
    (None, STOP_DEADLINE, (JobStatus.FAILED, "deadline_exceeded", None)),
    (ExitStatus(code=0), STOP_DEADLINE, (JobStatus.FAILED, "deadline_exceeded", None)),
    (ExitStatus(code=10), STOP_STALL, (JobStatus.STALE, "progress_stalled", "progress_stalled")),
]


@pytest.mark.parametrize(
    ("status", "recorded", "expected", "cancel_asked"),
    # cancel_asked with no stop recorded is an operator's cancel (tested above).
    [(*row, asked) for row in STOPPED for asked in (False, True) if row[1] is not None or not asked],
)
def test_INV_STOP_REASON_BEFORE_SIGNAL_the_stop_the_row_records_decides_its_end_whatever_the_exit(
    status: ExitStatus | None, recorded: str | None, expected: object, cancel_asked: bool
) -> None:
    """Decided by a boot that did not begin the stop (no ``stop`` of its own; ``cancel_asked``: it carried the stop on
    as a cancel): the registry takes the ending for the stop the row records, and a cancel on the row still wins."""
    decided = ending(
        status, kind=KIND, cancel_asked=cancel_asked, stop=None, orphan_reason="o", policy=POLICY, now=NOW
    ).for_stop(recorded)
    chosen = decided.chosen(cancel_requested=False)
    assert (chosen.status, chosen.reason, None if decided.retry is None else decided.retry.why) == expected
    assert decided.chosen(cancel_requested=True).status is JobStatus.CANCELLED
    assert decided.exit_code == (status.returncode if status is not None else None)


def test_a_stall_stop_on_the_last_attempt_is_not_resubmitted() -> None:
    last = ending(ExitStatus(code=75), kind=KIND, cancel_asked=False, stop=None, orphan_reason="o", attempts=3,
                  policy=POLICY, now=NOW).for_stop(STOP_STALL)  # fmt: skip
    assert (last.outcome.reason, last.retry) == ("progress_stalled", None)


def test_the_last_attempt_ends_with_its_crash_and_no_policy_never_retries() -> None:
    assert end(None, attempts=3) == (JobStatus.FAILED, "orphan_reconciled_dead_pid", None)
    assert ending(None, kind=None, cancel_asked=False, stop=None, orphan_reason="o", now=NOW).retry is None
    assert NO_RETRY.max_attempts == 1


def test_the_backoff_doubles_up_to_its_cap_times_the_jitter() -> None:
    assert [backoff_s(n, POLICY, 1.0) for n in (1, 2, 3, 4)] == [60.0, 100.0, 100.0, 100.0]
    assert backoff_s(1, POLICY, 1.1) == pytest.approx(66.0)
    assert backoff_s(10_000, POLICY, 0.9) == pytest.approx(90.0)  # no overflow however many attempts
    decided = ending(
        ExitStatus(code=75),
        kind=KIND,
        cancel_asked=False,
        stop=None,
        orphan_reason="o",
        policy=POLICY,
        now=NOW,
        jitter=1.0,
    )
    assert decided.retry is not None and decided.retry.not_before == NOW + timedelta(seconds=60)


# -- on a virtual clock --------------------------------------------------------------------------------------

TEMPFAIL_KINDS = """
[kinds.tempfail]
argv = ["{python}", "-c", "import sys; sys.exit(75)", "{code}"]
params = { code = "int" }
max_attempts = 4
retry_backoff_seconds = 60
retry_backoff_max_seconds = 100
retry_on_exit_codes = [75]
"""


@pytest.fixture
async def virtual_supervisor(tmp_path: Path) -> AsyncIterator[Callable[[], Supervisor]]:
    """A supervisor whose wall clock is the event loop's (virtual) clock, on the in-memory registry and executor:
    the drainer's wait for a backoff is virtual time, and nothing runs in a thread but the log's write."""
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(TEMPFAIL_KINDS)

    def wall() -> datetime:
        return NOW + timedelta(seconds=trio.current_time())

    async with trio.open_nursery() as nursery:
        config = Config(data_dir=tmp_path / "data", bind_port=0, kinds_file=kinds, sweep_interval_s=86400.0)
        machine = MemoryExecutor({**PROGRAMS, "tempfail": PROGRAMS["exit"]}, nursery)
        sup = Supervisor(
            config,
            load_kinds(kinds),
            MemoryRegistry(clock=wall),
            boot_id="b",
            executor=machine,
            standalone=True,
            wall_clock=wall,
        )
        sup.attach(nursery)
        await nursery.start(sup.drainer.run)  # the only task that starts jobs; no sweeper to wake it
        yield lambda: sup
        nursery.cancel_scope.cancel()


async def test_a_resubmitted_job_starts_when_its_backoff_ends_and_not_before(
    autojump_clock: trio.testing.MockClock,  # pytest-trio runs the test on a clock the test itself requests
    virtual_supervisor: Callable[[], Supervisor],
) -> None:
    sup = virtual_supervisor()
    starts: list[float] = []
    done = trio.Event()

    def on_event(event: JobEvent) -> None:
        if event.event is EventName.TRANSITION and event.job.status is JobStatus.RUNNING:
            starts.append(trio.current_time())
        if event.job.status.is_terminal:
            done.set()

    sup.events.subscribe(on_event)
    job = (await sup.enqueue("tempfail", {"code": 75})).job
    # No deadline around the wait: the autojumping clock jumps to any pending deadline while a worker thread runs
    # (the pause file's look, the log's write), which would end a bound early. pytest-timeout is the backstop.
    await done.wait()
    final = await sup.get(job.job_id)
    assert (final.status, final.error_reason, final.attempts, len(final.history)) == (
        JobStatus.FAILED,
        "exit_code_75",
        4,
        3,
    )
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # 60 s, then 120 s capped at 100 s, twice; each times a jitter within 0.9-1.1.
    assert len(gaps) == 3
    assert 54.0 <= gaps[0] <= 66.0 and all(90.0 <= gap <= 110.0 for gap in gaps[1:]), gaps
    # Each attempt's history entry is stamped on the same (virtual) wall clock.
    [first, second, _] = final.history
    assert second.started_at is not None and second.started_at - first.ended_at == timedelta(seconds=gaps[0])
