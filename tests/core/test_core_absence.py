"""Absence detection (ADR 0002 D8-D9): progress age and heartbeat silence, judged by the sweeper.

The rules are a pure table (``judge_absence``). The sweeper tests run on a virtual clock and assert the virtual time
at which a flag is judged; the jobs are real processes (bystanders this boot adopts), so liveness is real evidence.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import trio
import trio.testing
from core_helpers import insert_running, take_beat, wait_terminal  # type: ignore[import-not-found]

from supervisor import Job, JobStatus, Liveness, Supervisor
from supervisor.core import ABSENT_AFTER_S, CHECK_IN_S, AbsenceTracker, Signals, judge_absence
from supervisor.domain import from_iso
from supervisor.execution.subprocess import identify, probe
from supervisor.observe import EventName, JobEvent
from supervisor.testing import SCENARIO_EPOCH, Scenario

ALIVE, DEAD, UNKNOWN = Liveness.ALIVE, Liveness.DEAD, Liveness.UNKNOWN
S, Q, R = EventName.STALLED, EventName.SILENT, EventName.RECOVERED

# (name, progress age, heartbeat age, liveness, row stalled, row silent, action) -> (stalled, silent, events, terminate)
# Thresholds: stalled past 100 s of no progress, silent past 60 s without a heartbeat.
TABLE = [
    ("INV-PROGRESS-NOT-LIVENESS fresh progress", 10, 5, ALIVE, False, False, "alert", (False, False, (), False)),
    ("at the threshold is not past it", 100, 5, ALIVE, False, False, "alert", (False, False, (), False)),
    ("INV-PROGRESS-NOT-LIVENESS no progress", 101, 5, ALIVE, False, False, "alert", (True, False, (S,), False)),
    ("already stalled: no second event", 500, 5, ALIVE, True, False, "alert", (True, False, (), False)),
    ("progress resumed clears the flag", 3, 3, ALIVE, True, False, "alert", (False, False, (R,), False)),
    ("never heartbeated: progress age alone", 101, None, ALIVE, False, False, "alert", (True, False, (S,), False)),
    ("never heartbeated is never silent", 50, None, ALIVE, False, False, "alert", (False, False, (), False)),
    ("INV-SILENT-NEEDS-A-LIVE-PROCESS beats stop", 61, 61, ALIVE, False, False, "alert", (False, True, (Q,), False)),
    ("INV-SILENT-NEEDS-A-LIVE-PROCESS unknown", 61, 61, UNKNOWN, False, False, "alert", (False, False, (), False)),
    ("INV-SILENT-NEEDS-A-LIVE-PROCESS dead", 61, 61, DEAD, False, False, "alert", (False, False, (), False)),
    ("silent stays silent without evidence", 61, 70, UNKNOWN, False, True, "alert", (False, True, (), False)),
    ("beats resume: silence clears", 70, 1, UNKNOWN, False, True, "alert", (False, False, (R,), False)),
    ("both at once", 101, 61, ALIVE, False, False, "alert", (True, True, (S, Q), False)),
    ("one clears, one sets", 101, 1, ALIVE, False, True, "alert", (True, False, (R, S), False)),
    ("terminate a live stalled job", 101, None, ALIVE, False, False, "terminate", (True, False, (S,), True)),
    ("terminate again while it still lives", 900, None, ALIVE, True, False, "terminate", (True, False, (), True)),
    ("INV-UNKNOWN-KEEPS-SLOT never terminate unknown", 101, None, UNKNOWN, False, False, "terminate",
     (True, False, (S,), False)),
    ("INV-UNKNOWN-KEEPS-SLOT unprobed", 101, None, None, False, False, "terminate", (True, False, (S,), False)),
    ("terminate never fires before the threshold", 99, None, ALIVE, False, False, "terminate",
     (False, False, (), False)),
]


@pytest.mark.parametrize(("name", "progress", "beat", "live", "stalled", "silent", "action", "expected"), TABLE)
def test_absence_rule_table(
    name: str,
    progress: float,
    beat: float | None,
    live: Liveness | None,
    stalled: bool,
    silent: bool,
    action: str,
    expected: tuple[bool, bool, tuple[EventName, ...], bool],
) -> None:
    verdict = judge_absence(
        Signals(progress, beat, live, stalled, silent), stale_after_s=100, silent_after_s=60, action=action  # type: ignore[arg-type]
    )
    assert (verdict.stalled, verdict.silent, verdict.events, verdict.terminate) == expected, name


def test_disabled_thresholds_never_flag() -> None:
    verdict = judge_absence(
        Signals(10**9, 10**9, ALIVE, False, False), stale_after_s=None, silent_after_s=None, action="terminate"
    )
    assert (verdict.stalled, verdict.silent, verdict.events, verdict.terminate) == (False, False, (), False)


def _row(**fields: object) -> Job:
    base: dict[str, object] = dict(
        job_id="j", seq=1, kind="k", params={}, argv=[], status=JobStatus.RUNNING, error_reason=None, exit_code=None,
        created_at="2026-01-01T00:00:00+00:00", started_at="2026-01-01T00:00:00+00:00", ended_at=None, attempts=1,
        cancel_requested=False, boot_id="b", identity=None,
        token_hash=None, completed_units=0, total_units=None, stage=None, last_heartbeat_at=None,
        last_progress_at=None, log_path=None,
    )
    base.update(fields)
    for name in ("created_at", "started_at", "last_heartbeat_at", "last_progress_at"):
        if isinstance(base[name], str):
            base[name] = from_iso(str(base[name]))
    return Job(**base)  # type: ignore[arg-type]


def test_INV_ABSENCE_MONOTONIC_a_wall_clock_jump_changes_no_age() -> None:
    mono = [1000.0]
    wall = [datetime(2026, 1, 1, 0, 10, tzinfo=UTC)]
    tracker = AbsenceTracker(clock=lambda: mono[0], wall_clock=lambda: wall[0])
    job = _row(stalled=True)
    # First sight of a prior boot's flagged job: aged once from its stored stamps (started 10 minutes ago).
    assert tracker.signals(job, ALIVE).progress_age_s == 600
    mono[0] += 30
    wall[0] += timedelta(hours=5)  # the wall clock jumps forward: no rule may fire because of it
    assert tracker.signals(job, ALIVE).progress_age_s == 630
    wall[0] -= timedelta(days=2)  # and back
    mono[0] += 30
    assert tracker.signals(job, ALIVE).progress_age_s == 660


def test_INV_OWN_ABSENCE_NOT_THE_JOBS_a_prior_boots_job_is_aged_from_this_boots_first_look() -> None:
    """A restart after an outage: the stored stamps are as old as the outage, which no job could report through.
    An unflagged job is aged from this boot's first look (so a truly stalled one is flagged a threshold after it); a
    job the previous boot had flagged keeps its stored age (and its flag) until it beats or progresses."""
    mono = [1000.0]
    wall = [datetime(2026, 1, 1, 0, 10, tzinfo=UTC)]
    tracker = AbsenceTracker(clock=lambda: mono[0], wall_clock=lambda: wall[0])
    beaten = "2026-01-01T00:09:00+00:00"  # its last beat a minute ago, its progress ten minutes ago
    fresh = tracker.signals(_row(job_id="a", last_heartbeat_at=beaten), ALIVE)
    assert (fresh.progress_age_s, fresh.heartbeat_age_s) == (0, 0)
    mono[0] += 40
    wall[0] += timedelta(seconds=40)
    # Seen later in this boot (another host's job adopted): its stamps count, but never from before the first look.
    later = tracker.signals(_row(job_id="b", last_heartbeat_at="2026-01-01T00:10:30+00:00"), ALIVE)
    assert (later.progress_age_s, later.heartbeat_age_s) == (40, 10)
    flagged = tracker.signals(_row(job_id="c", stalled=True, silent=True, last_heartbeat_at=beaten), ALIVE)
    assert (flagged.progress_age_s, flagged.heartbeat_age_s) == (640, 100)


def test_INV_OWN_ABSENCE_NOT_THE_JOBS_a_gap_between_check_ins_moves_every_jobs_clocks() -> None:
    """A frozen supervisor (SIGSTOP, swapped out) took no beat meanwhile: a gap between two check-ins longer than
    ABSENT_AFTER_S is its absence, and no age counts it. Without a check-in task, a long wait is only a long wait."""
    mono = [0.0]
    tracker = AbsenceTracker(clock=lambda: mono[0], wall_clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    job = _row(started_at="2026-01-01T00:00:00+00:00")
    tracker.signals(job, ALIVE)
    mono[0] = 10.0
    assert tracker.check_in() == 0.0  # no check-in task: nothing is an absence
    assert tracker.signals(job, ALIVE).progress_age_s == 10
    tracker.begin_check_ins()  # as keep_checking_in does when it starts
    mono[0] += ABSENT_AFTER_S  # a loop busy for this long is not absent
    assert tracker.check_in() == 0.0
    mono[0] += 8.0  # frozen for 8 s
    assert tracker.check_in() == 8.0 and tracker.absent_s == 8.0
    assert tracker.signals(job, ALIVE).progress_age_s == 10 + ABSENT_AFTER_S


async def test_INV_OWN_ABSENCE_NOT_THE_JOBS_the_check_in_task_says_an_absence_and_ages_skip_it(
    autojump_clock: trio.testing.MockClock, capsys: pytest.CaptureFixture[str]
) -> None:
    tracker = AbsenceTracker(wall_clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    job = _row(started_at="2026-01-01T00:00:00+00:00")
    async with trio.open_nursery() as nursery:
        await nursery.start(tracker.keep_checking_in)
        tracker.signals(job, ALIVE)
        await trio.sleep(5)
        assert "supervisor_was_absent" not in capsys.readouterr().out  # on time: no absence
        autojump_clock.jump(30)  # the process was stopped for 30 s: every timer is late by that much
        await trio.sleep(CHECK_IN_S)
        assert tracker.absent_s >= 30
        assert tracker.signals(job, ALIVE).progress_age_s <= 5 + CHECK_IN_S * 2
        nursery.cancel_scope.cancel()
    assert capsys.readouterr().out.count("supervisor_was_absent") == 1


def test_a_stamp_moved_by_another_process_counts_from_when_this_boot_saw_it() -> None:
    mono = [0.0]
    tracker = AbsenceTracker(clock=lambda: mono[0], wall_clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    job = _row()
    tracker.signals(job, ALIVE)
    mono[0] = 500
    moved = _row(last_progress_at="2025-06-01T00:00:00+00:00", last_heartbeat_at="2025-06-01T00:00:00+00:00")
    seen = tracker.signals(moved, ALIVE)  # the stamps are old by the wall clock, but new to this boot
    assert (seen.progress_age_s, seen.heartbeat_age_s) == (0, 0)


def test_a_future_stamp_counts_as_now_never_younger() -> None:
    tracker = AbsenceTracker(clock=lambda: 50.0, wall_clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    seen = tracker.signals(_row(started_at="2026-01-02T00:00:00+00:00"), ALIVE)
    assert seen.progress_age_s == 0


# -- the sweeper, on a virtual clock, with real processes ----------------------------------------------------------

SWEEP_S = 30.0


def _spawn_bystander(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"  # its signal handlers are in place
    return proc


@pytest.fixture
def term_ignorer() -> Iterator[subprocess.Popen[bytes]]:
    proc = _spawn_bystander(
        "import signal, threading; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
        "threading.Event().wait(120)"
    )
    yield proc
    proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.fixture
def frozen_wall() -> Callable[[Supervisor, Job], None]:
    """Age first-seen rows from their own start: the real milliseconds between insert and first sweep are not
    virtual time, and would move the boundary the tests assert."""

    def freeze(sup: Supervisor, job: Job) -> None:
        started = job.started_at
        assert started is not None
        sup.absence.tracker.wall_clock = lambda: started

    return freeze


@pytest.fixture
def make_sup(
    autojump_clock: trio.testing.MockClock, make_supervisor: Callable[..., Supervisor]
) -> Iterator[Callable[..., Supervisor]]:
    """``make_supervisor`` on the virtual clock. At teardown the clock runs at real speed again: the supervisors'
    teardown waits (bounded) for monitors that watch real processes, which virtual time would not wait for."""
    yield make_supervisor
    autojump_clock.autojump_threshold = math.inf
    autojump_clock.rate = 1.0


class Recorder:
    def __init__(self, sup: Supervisor) -> None:
        self.start = trio.current_time()
        self.events: list[tuple[float, EventName, str]] = []
        sup.events.subscribe(self.on_event)

    def on_event(self, event: JobEvent) -> None:
        if event.event is not EventName.ADOPTED:
            self.events.append((trio.current_time() - self.start, event.event, str(event.job.status)))

    def at(self, name: EventName) -> list[float]:
        return [t for t, n, _ in self.events if n is name]


async def _beat(sup: Supervisor, job: Job, units: int) -> None:
    async def body() -> object:
        return {"completed_units": units}

    await take_beat(sup.heartbeats, job.job_id, "t", body)  # insert_running's rows carry the token "t"
    await sup.heartbeats.flush()  # written now, as the writer task would within its interval


async def test_stalled_at_the_first_sweep_past_the_threshold_and_not_one_before(supervisor_scenario: Scenario) -> None:
    """The production tree in virtual time (the scenario kit): a job that beats every 5 s and never progresses,
    swept every 30 s, is flagged at the first sweep past 1800 s of no progress, once, and keeps running."""
    sc = supervisor_scenario
    await sc.start(kinds={"spin": sc.script(beats_every=5)}, progress_stale_after_s=1800.0, sweep_interval_s=SWEEP_S)
    job_id = await sc.enqueue("spin")  # promoted at once: its progress is aged from its start, at 0
    await sc.advance(1800)
    assert not (await sc.job(job_id)).stalled  # exactly at the threshold: not past it
    await sc.advance(SWEEP_S)
    row = await sc.job(job_id)
    # INV-SWEEP-NEVER-EVICTS-LIVE: with the default action (alert) the job keeps running and keeps its slot.
    assert (row.status, row.stalled, row.silent) == (JobStatus.RUNNING, True, False)
    assert row.stalled_since == SCENARIO_EPOCH + timedelta(seconds=1830)
    await sc.advance(3600)
    assert [hook["event"] for hook in sc.webhooks()].count("job.stalled") == 1  # announced once


async def test_rising_progress_clears_a_stall_and_a_beat_without_progress_does_not(
    autojump_clock: trio.testing.MockClock,  # pytest-trio runs the test on a clock the test itself requests
    make_sup: Callable[..., Supervisor],
    bystander: subprocess.Popen[bytes],
    frozen_wall: Callable[[Supervisor, Job], None],
) -> None:
    sup = make_sup(boot_id="now", progress_stale_after_s=300.0, silent_after_s=None, sweep_interval_s=SWEEP_S)
    job = await insert_running(sup, boot_id="before", identity=identify(bystander.pid))
    frozen_wall(sup, job)
    seen = Recorder(sup)
    for t in range(0, 600, 10):
        assert trio.current_time() - seen.start == t
        if t == 340:
            await _beat(sup, job, 0)  # INV-PROGRESS-NOT-LIVENESS: alive, but the watermark did not rise
        if t == 370:
            await _beat(sup, job, 1)  # progress
        if t % SWEEP_S == 0:
            await sup.sweeper.sweep()
        await trio.sleep(10)
    assert seen.at(EventName.STALLED)[0] == 330.0
    assert seen.at(EventName.RECOVERED) == [390.0]  # the first sweep after the watermark rose, not after the beat
    # Progress at 370, so stalled again at the first sweep past 670: beyond this test's 600 s.
    assert len(seen.at(EventName.STALLED)) == 1
    row = await sup.get(job.job_id)
    assert (row.stalled, row.stalled_since, row.completed_units) == (False, None, 1)


async def test_heartbeats_that_stop_while_the_process_lives_are_silent_not_stalled(
    autojump_clock: trio.testing.MockClock,  # pytest-trio runs the test on a clock the test itself requests
    make_sup: Callable[..., Supervisor],
    bystander: subprocess.Popen[bytes],
    frozen_wall: Callable[[Supervisor, Job], None],
) -> None:
    sup = make_sup(boot_id="now", progress_stale_after_s=1800.0, silent_after_s=60.0, sweep_interval_s=SWEEP_S)
    job = await insert_running(sup, boot_id="before", identity=identify(bystander.pid))
    frozen_wall(sup, job)
    seen = Recorder(sup)
    for t in range(0, 300, 10):
        if t <= 100 or t >= 200:
            await _beat(sup, job, min(t, 100) // 10)  # beats stop at 100 s (so does progress), resume at 200 s
        if t % SWEEP_S == 0:
            await sup.sweeper.sweep()
        await trio.sleep(10)
    # Last beat at 100 s: 60 s of silence is not past the threshold at the sweep at 150, it is at 180.
    assert seen.at(EventName.SILENT) == [180.0]
    assert seen.at(EventName.RECOVERED) == [210.0]  # beats resumed at 200 s
    assert seen.at(EventName.STALLED) == []  # silence is a different signal from a stall
    row = await sup.get(job.job_id)
    assert (row.status, row.silent, row.stalled) == (JobStatus.RUNNING, False, False)


async def test_terminate_frees_the_slot_only_once_the_process_is_gone(
    autojump_clock: trio.testing.MockClock,  # pytest-trio runs the test on a clock the test itself requests
    make_sup: Callable[..., Supervisor],
    term_ignorer: subprocess.Popen[bytes],
    frozen_wall: Callable[[Supervisor, Job], None],
) -> None:
    sup = make_sup(
        boot_id="now", progress_stale_after_s=300.0, stall_action="terminate", cancel_grace_s=20.0,
        sweep_interval_s=SWEEP_S,
    )
    identity = identify(term_ignorer.pid)
    assert identity is not None
    job = await insert_running(sup, boot_id="before", identity=identity)
    frozen_wall(sup, job)
    seen = Recorder(sup)
    liveness_when_ended: list[Liveness] = []

    def on_end(event: JobEvent) -> None:
        if event.event is EventName.TRANSITION and event.job.status.is_terminal:
            liveness_when_ended.append(probe(identity))

    sup.events.subscribe(on_end)
    while (await sup.get(job.job_id)).status is JobStatus.RUNNING and trio.current_time() - seen.start < 600:
        await sup.sweeper.sweep()
        await trio.sleep(SWEEP_S)
    # By now SIGKILL has been sent (a virtual-time timer); the real process dies in real time, which a loaded machine
    # stretches while the autojumping clock races on. Wait for it on a clock that runs as the wall clock does.
    autojump_clock.autojump_threshold = math.inf
    autojump_clock.rate = 1.0
    final = await wait_terminal(sup, job.job_id)
    assert (final.status, final.error_reason) == (JobStatus.STALE, "progress_stalled")
    # It ignored SIGTERM: the row ended only after SIGKILL, a full grace after the stall, with the process gone.
    assert liveness_when_ended == [Liveness.DEAD]
    stalled_at = seen.at(EventName.STALLED)
    assert stalled_at == [330.0]
    ended_at = [t for t, name, status in seen.events if status == "stale"]
    assert ended_at and ended_at[0] >= stalled_at[0] + 20.0
    assert term_ignorer.poll() == -signal.SIGKILL


async def test_terminate_never_stops_a_job_whose_liveness_is_unknown(
    autojump_clock: trio.testing.MockClock,  # pytest-trio runs the test on a clock the test itself requests
    make_sup: Callable[..., Supervisor],
    bystander: subprocess.Popen[bytes],
    frozen_wall: Callable[[Supervisor, Job], None],
) -> None:
    sup = make_sup(
        boot_id="now", progress_stale_after_s=300.0, stall_action="terminate", sweep_interval_s=SWEEP_S
    )
    # A pid without its start time: the process cannot be verified, so its liveness is unknown.
    job = await insert_running(sup, boot_id="before", pid=bystander.pid)
    frozen_wall(sup, job)
    seen = Recorder(sup)
    for _ in range(20):
        await sup.sweeper.sweep()
        await trio.sleep(SWEEP_S)
    row = await sup.get(job.job_id)
    assert (row.status, row.stalled) == (JobStatus.RUNNING, True)  # flagged, and keeps its slot
    assert seen.at(EventName.STALLED) == [330.0]
    assert bystander.poll() is None  # never signalled
    os.kill(bystander.pid, 0)
