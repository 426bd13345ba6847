"""One boot's nursery tree, started in order: the tasks ``run_supervisor`` starts before it serves HTTP, and all that
the scenario kit (``supervisor.testing``) starts, so that a scenario runs the production tree and nothing else."""

from __future__ import annotations

import functools
from typing import Any

import trio

from ._supervisor import Supervisor
from ._sweeper import QuietSweeps, run_sweeper


async def run_job_nursery(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Own every monitor. Cancelled last at shutdown; cancelling a monitor never kills its job."""
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()


async def start_tree(
    supervisor: Supervisor, root: trio.Nursery, *, virtual_time: bool = False, quiet_sweeps: QuietSweeps | None = None
) -> None:
    """Start ``supervisor``'s tasks in ``root``, each with ``root.start`` (it returns once each is ready); cancelling
    ``root`` ends the boot, and its jobs run on (they are the executor's, not the tree's).

    ``virtual_time``: the boot runs on ``trio.testing.MockClock`` (the scenario kit), where time moves only when every
    task waits, so this process can never be frozen while time passes: the check-in that notices such a freeze is not
    started (INV-OWN-ABSENCE-NOT-THE-JOBS holds without it), and its wake-ups (two a second) cost nothing.
    ``quiet_sweeps`` (virtual time only): says when the sweeps have nothing to act on, so that the sweeper sleeps
    through those ticks (``_sweeper.run_sweeper``)."""
    supervisor.attach(await root.start(run_job_nursery))
    # This host's lease, the fleet's lead and its limit (ADR 0012): settled before anything promotes.
    await root.start(supervisor.run_fleet)
    await root.start(supervisor.run_drainer)
    # Listening before the startup sweep: a change made after this is heard, one made before is swept.
    await root.start(supervisor.run_wakeups)
    # Started before the first sweep, so that events left undelivered by a previous boot go out first.
    await root.start(supervisor.webhooks.run)
    # This process's own presence, noted every half second: an absence (a freeze) is not the jobs'.
    if not virtual_time:
        await root.start(supervisor.absence.tracker.keep_checking_in)
    # The startup sweep runs before serving; it never waits on a job, so /api/health is not delayed.
    if quiet_sweeps is None:
        await root.start(supervisor.run_sweeper)
    else:  # virtual time: the sweeper sleeps through ticks with nothing to act on
        every_s, tally = supervisor.config.sweep_interval_s, supervisor.boot.tally
        await root.start(functools.partial(run_sweeper, supervisor.sweeper, every_s, tally=tally, quiet=quiet_sweeps))
    await root.start(supervisor.heartbeats.run)  # the beats the API takes, written behind (ADR 0018)
