"""A stepped system clock (ADR 0010): an hour forward or back fires no rule wrongly -- no stall, no wall-clock stale,
no backoff skipped or stretched -- because one ``SteadyWallClock`` (the system's time at boot, moved by the
monotonic clock) stamps every row and times every rule of a boot (INV-MONOTONIC-DURATIONS). The sweeper says once
that the system clock stepped away, and once that it agrees again.

Virtual time throughout: the in-memory registry and executor, the event loop's clock as the monotonic one, and a
"system" wall clock that the test steps.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog
import trio
import trio.testing
from core_executors import PROGRAMS  # type: ignore[import-not-found]

from supervisor import Config, Supervisor, load_kinds
from supervisor.domain import JobStatus, SteadyWallClock
from supervisor.execution.memory import MemoryExecutor
from supervisor.observe import EventName, JobEvent
from supervisor.registry import MemoryRegistry

NOW = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
HOUR_S = 3600.0
KINDS = """
[kinds.tempfail]
argv = ["{python}", "-c", "import sys; sys.exit(75)", "{code}"]
params = { code = "int" }
max_attempts = 2
retry_backoff_seconds = 600
retry_on_exit_codes = [75]

[kinds.sleep]
argv = ["{python}", "-c", "pass", "{seconds}"]
params = { seconds = "float" }
"""


@pytest.fixture
def jump_clock() -> trio.testing.MockClock:
    """Virtual time that jumps only once nothing has moved for 50 ms of real time: a sweep's thread hop (the pause
    file's look) finishes first, instead of letting the clock leap to the sleeping job's end meanwhile."""
    return trio.testing.MockClock(autojump_threshold=0.05)


@dataclass
class World:
    sup: Supervisor
    step_s: list[float] = field(default_factory=lambda: [0.0])

    def step(self, seconds: float) -> None:
        """The system clock jumps (``date -s``, NTP fixing a wrong RTC): only the system's wall time moves."""
        self.step_s[0] += seconds


def _system_wall(step_s: list[float]) -> Callable[[], datetime]:
    return lambda: NOW + timedelta(seconds=trio.current_time() + step_s[0])


@pytest.fixture
async def make_world(tmp_path: Path) -> AsyncIterator[Callable[..., World]]:
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    async with trio.open_nursery() as nursery:

        def make(*, steady: bool = True) -> World:
            step_s = [0.0]
            system = _system_wall(step_s)
            clock = SteadyWallClock(wall=system, monotonic=trio.current_time) if steady else system
            config = Config(
                data_dir=tmp_path / "data",
                bind_port=0,
                kinds_file=kinds,
                sweep_interval_s=30.0,
                stale_after_s=1800.0,
                progress_stale_after_s=1800.0,
                stall_action="terminate",
            )
            programs = {**PROGRAMS, "tempfail": PROGRAMS["exit"]}
            sup = Supervisor(
                config,
                load_kinds(kinds),
                MemoryRegistry(clock=clock),
                boot_id="b",
                executor=MemoryExecutor(programs, nursery),
                wall_clock=clock,
                standalone=True,
            )
            sup.attach(nursery)
            nursery.start_soon(sup.drainer.run)
            return World(sup, step_s)

        yield make
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("step_s", [HOUR_S, -HOUR_S], ids=["forward", "back"])
async def test_INV_MONOTONIC_DURATIONS_a_stepped_clock_neither_skips_nor_stretches_a_backoff(
    jump_clock: trio.testing.MockClock, make_world: Callable[..., World], step_s: float
) -> None:
    world = make_world()
    starts: list[float] = []
    done = trio.Event()

    def on_event(event: JobEvent) -> None:
        if event.event is EventName.TRANSITION and event.job.status is JobStatus.RUNNING:
            starts.append(trio.current_time())
        if event.event is EventName.TRANSITION and event.job.status is JobStatus.QUEUED and starts:
            world.step(step_s)  # resubmitted: the clock jumps while it waits out its backoff
        if event.job.status.is_terminal:
            done.set()

    world.sup.events.subscribe(on_event)
    job = (await world.sup.enqueue("tempfail", {"code": 75})).job
    await done.wait()  # no deadline: see test_core_resubmit (a worker thread's wait would end it early)
    final = await world.sup.get(job.job_id)
    assert (final.status, final.attempts) == (JobStatus.FAILED, 2)
    [gap] = [b - a for a, b in itertools.pairwise(starts)]
    assert 540.0 <= gap <= 660.0, gap  # 600 s and its jitter, as if nothing had happened to the clock


@pytest.mark.parametrize("step_s", [HOUR_S, -HOUR_S], ids=["forward", "back"])
async def test_INV_MONOTONIC_DURATIONS_a_stepped_clock_fires_no_stall_and_no_wall_clock_stale(
    jump_clock: trio.testing.MockClock, make_world: Callable[..., World], step_s: float
) -> None:
    world = make_world()
    sup = world.sup
    job = (await sup.enqueue("sleep", {"seconds": 3 * HOUR_S})).job
    await sup.drainer.drain()
    assert (await sup.get(job.job_id)).status is JobStatus.RUNNING
    await trio.sleep(60)
    world.step(step_s)
    with structlog.testing.capture_logs() as logs:
        for _ in range(10):  # five minutes of sweeps
            await sup.sweeper.sweep()
            await trio.sleep(30)
        # The operator's reconcile marks a live job stale once past stale_after_s by this boot's clock: not yet.
        report = await sup.operator_reconcile()
    row = await sup.get(job.job_id)
    assert (row.status, row.stalled, report.updated) == (JobStatus.RUNNING, False, 0)
    assert not [e for e in logs if e.get("reason") == "wall_clock_exceeded_kept_alive"]
    steps = [e for e in logs if e["event"] == "wall_clock_stepped"]
    assert [(e["log_level"], e["step_s"]) for e in steps] == [("warning", step_s)]  # once, not once per sweep
    # Back in agreement (NTP stepped it back): said once too.
    world.step(-step_s)
    with structlog.testing.capture_logs() as logs:
        await sup.sweeper.sweep()
        await sup.sweeper.sweep()
    assert [e["event"] for e in logs if e["event"].startswith("wall_clock")] == ["wall_clock_agrees"]


async def test_without_the_steady_clock_the_same_step_forward_would_mark_a_live_job_stale(
    jump_clock: trio.testing.MockClock, make_world: Callable[..., World]
) -> None:
    """The test above can fail: a boot on the system's wall clock judges the step as an hour of running."""
    world = make_world(steady=False)
    sup = world.sup
    job = (await sup.enqueue("sleep", {"seconds": 3 * HOUR_S})).job
    await sup.drainer.drain()
    world.step(HOUR_S)
    report = await sup.operator_reconcile()
    row = await sup.get(job.job_id)
    assert (row.status, row.error_reason, report.updated) == (JobStatus.STALE, "wall_clock_stale", 1)
