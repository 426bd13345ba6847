"""The sweeper: reconcile -> absence -> drain every ``sweep_interval_s``, and once at startup (ADR 0001 §1); then,
at most once a minute, a small batch of history past its retention (``_prune``).

Order matters: freeing a ghost slot (reconcile) is what makes a promotion (drain) possible in the wedged case, and
progress age is judged on this sweep's evidence. The startup sweep matters as much as the loop: a restart is
precisely when ghost rows exist. Each sweep also mirrors the operator's pause file into the registry (``_pause``).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import trio

from ..domain import Liveness
from ..observe import Metrics, get_logger
from ._absence import AbsenceJudge
from ._boot import Boot, Tally, boundary
from ._drain import Drainer
from ._pause import PauseFile
from ._prune import Pruner
from ._queue_watch import QueueWatch
from ._reconcile import ReconcileDetail, Reconciler

log = get_logger()

# A difference between the system's wall clock and this boot's (SteadyWallClock) of at least this much is a step.
CLOCK_STEP_WARN_S = 2.0


class Sweepable(Protocol):
    async def sweep(self) -> None: ...


class QuietSweeps(Protocol):
    """Virtual time only (the scenario kit): whether the sweeps to come have nothing to act on, and a wake-up when
    that may have changed. See docs/testing.md § Virtual time is free."""

    async def quiet_until(self) -> float:
        """The virtual time until which every sweep would find nothing to do (``math.inf``: until ``changed``), or
        the current time when a sweep may have work. Rings before this call are taken by it."""
        ...

    async def changed(self) -> None:
        """Return once something may have given the sweeps work (a job enqueued, a pause, a verb of the scenario)."""
        ...


async def run_sweeper(
    target: Sweepable,
    interval_s: float,
    *,
    tally: Tally | None = None,
    quiet: QuietSweeps | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """The sweeper task: sweep once, report started, then sweep every ``interval_s``.

    ``quiet`` (virtual time only): while it says the sweeps have nothing to act on, the sweeper sleeps through their
    ticks, each a sweep that would have done nothing, and sweeps again at the first tick after it is woken, on the
    same ticks as ever. In virtual time a wake-up is the cost: a quiet day of sweeps would cost seconds.

    Error boundary: a condition (the registry, the engine, a disk) never ends the loop: it is logged
    (``sweep_failed``) and counted, and the next sweep runs on time. A bug ends the supervisor (crash-only)."""
    with boundary("sweep_failed", tally):
        await target.sweep()
    task_status.started()
    while True:
        began = trio.current_time()
        until = await quiet.quiet_until() if quiet is not None else began
        if quiet is not None and until > began:
            with trio.move_on_at(until):
                await quiet.changed()
            ticks = max(1, math.ceil((trio.current_time() - began) / interval_s))
            await trio.sleep_until(began + ticks * interval_s)
        else:
            await trio.sleep(interval_s)
        with boundary("sweep_failed", tally):
            await target.sweep()


class Sweeper:
    """``last_sweep_done``: ``trio.current_time()`` when the last sweep completed (the watchdog reads it); a wedged
    sweep stops moving it."""

    def __init__(
        self,
        boot: Boot,
        reconciler: Reconciler,
        absence: AbsenceJudge,
        drainer: Drainer,
        metrics: Metrics,
        pause_file: PauseFile,
        pruner: Pruner,
        queue_watch: QueueWatch,
    ) -> None:
        """The steps of a sweep, in their order: the pause file, reconcile, the absence judge, the kinds' deadlines,
        the drainer, the queue's watch, the leftovers, the pruner; ``boot`` gives its clock and tally."""
        self.reconciler = reconciler
        self.absence = absence
        self.drainer = drainer
        self.metrics = metrics
        self.pause_file = pause_file
        self.last_sweep_done: float | None = None
        self.boot = boot
        self.pruner = pruner
        self.queue_watch = queue_watch
        self._warned_step_s = 0.0  # the step of the system clock last said (0: none)
        # What a dead boot recorded as ended and never released is looked for once per boot, at the first sweep
        # whose executor can tell (a boot that is alive releases each job itself once its row is final).
        self.leftovers_released = False

    async def run(self, *, quiet: QuietSweeps | None = None, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The sweeper task (``run_sweeper``): the startup sweep, then one every ``sweep_interval_s``; ``quiet``
        (virtual time only): says when the sweeps have nothing to act on, so that it sleeps through those ticks."""
        every_s = self.boot.config.sweep_interval_s
        await run_sweeper(self, every_s, tally=self.boot.tally, quiet=quiet, task_status=task_status)

    async def sweep(self) -> None:
        """One pass. Each step has its own error boundary (``boundary``): a condition in one still lets the next run;
        a bug ends the supervisor."""
        started = trio.current_time()
        tally = self.boot.tally
        self._check_clock()
        with boundary("pause_file_not_mirrored", tally, path=str(self.pause_file.path)):
            await self.pause_file.mirror()
        details: list[ReconcileDetail] = []
        with boundary("reconcile_failed", tally):
            details = (await self.reconciler.reconcile(stale_marks_live_processes=False)).details
        self.metrics.liveness_unknown.inc(len([d for d in details if d.liveness == Liveness.UNKNOWN.value]))
        with boundary("absence_judgement_failed", tally):
            # INV-STALE-SET-BY-SUPERVISOR: progress age is judged here, after reconcile, on this sweep's evidence.
            await self.absence.judge({d.job_id: Liveness(d.liveness) if d.liveness else None for d in details})
        with boundary("deadline_check_failed", tally):
            # Each kind's deadline_seconds, judged on the attempts' recorded starts: a stop, never a guess.
            await self.reconciler.stop_past_deadlines()
        with boundary("drain_failed", tally):
            await self.drainer.drain()
        with boundary("queue_watch_failed", tally):
            # After the drain: the queue as this sweep left it (docs/operations.md § The queue's watch).
            await self.queue_watch.judge()
        with boundary("schedule_watch_failed", tally):
            await self.queue_watch.judge_schedules()  # a schedule whose runs stopped coming
        if not self.leftovers_released:
            with boundary("leftovers_not_released", tally):
                self.leftovers_released = await self.reconciler.release_leftovers()
        with boundary("prune_failed", tally):
            # Last, and a small batch at most once a minute: history is no sweep's priority.
            await self.pruner.maybe_prune()
        self.last_sweep_done = trio.current_time()
        self.metrics.sweep_duration.observe(self.last_sweep_done - started)

    def _check_clock(self) -> None:
        """Say once when the system clock has stepped away from this boot's (and once when it is back): nothing is
        judged by the new time (INV-MONOTONIC-DURATIONS), but the operator should know that this boot's timestamps
        now differ from the system's, until a restart."""
        step_of = getattr(self.boot.wall_clock, "step_s", None)
        if step_of is None:
            return
        step_s = step_of()
        if abs(step_s) >= CLOCK_STEP_WARN_S and abs(step_s - self._warned_step_s) >= CLOCK_STEP_WARN_S:
            log.warning(
                "wall_clock_stepped",
                step_s=round(step_s, 3),
                effect="none on durations or rules; this boot's timestamps keep its own timeline until a restart",
            )
            self._warned_step_s = step_s
        elif abs(step_s) < CLOCK_STEP_WARN_S and self._warned_step_s:
            log.info("wall_clock_agrees", step_s=round(step_s, 3))
            self._warned_step_s = 0.0
