"""What ``GET /metrics`` reads of the registry (``RegistryReads``): read in a task of the nursery tree, never in the
scrape's own, so that a scrape answers within its budget whatever the registry does.

A scraper gives up after its timeout (10 s by default; a second in docs/alerting.md's test) and records the target
down: a scrape that waited on a registry lock held elsewhere read as ``PodcastSupervisorDown`` although the process
answered everything else. So a scrape starts a read (or joins the one under way), waits for it ``SCRAPE_BUDGET_S``
at most, and shows the last read that completed, with its age (``podcast_metrics_registry_age_seconds``). Reads only:
the beats taken and not yet written are laid over the rows from memory (``Heartbeats.known``), never flushed here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import trio

from ..domain import Job
from ..observe import RegistryView
from ._boot import Boot, boundary
from ._queue_watch import QueueWatch

# How long a scrape waits for the registry's fresh read before it shows the last one. Far below any scrape timeout
# (Prometheus' and vmagent's 10 s default; at least the interval's second of a one-second scrape).
SCRAPE_BUDGET_S = 0.5


class RegistryReads:
    """The registry's part of ``/metrics``: ``latest`` answers the freshest read within the budget and its age. Error
    boundary: a read that fails is the step ``metrics_read_failed`` (logged, counted); the scrape shows the last
    one meanwhile, older each time."""

    def __init__(self, boot: Boot, queue_watch: QueueWatch, budget_s: float = SCRAPE_BUDGET_S):
        """``queue_watch``: each kind's load, read with the registry's (``read_registry``)."""
        self.boot = boot
        self._queue_watch = queue_watch
        self.budget_s = budget_s
        self.view: RegistryView | None = None
        self.read_at_s: float | None = None  # trio.current_time() when ``view``'s read started
        self._reading: trio.Event | None = None

    async def latest(self) -> tuple[RegistryView | None, float]:
        """The last read that completed (None: none yet) and its age in seconds, after waiting ``budget_s`` at most
        for a fresh one. Without a job nursery (a Supervisor driven by hand), the read is the caller's own."""
        if not self.boot.tree.attached:
            await self._read()
        else:
            if self._reading is None:
                self._reading = trio.Event()
                self.boot.tree.nursery().start_soon(self._read_in_tree, self._reading)
            reading = self._reading
            with trio.move_on_after(self.budget_s):
                await reading.wait()
        age_s = 0.0 if self.read_at_s is None else max(0.0, trio.current_time() - self.read_at_s)
        return self.view, age_s

    async def _read_in_tree(self, done: trio.Event) -> None:
        try:
            with boundary("metrics_read_failed", self.boot.tally):
                await self._read()
        finally:
            self._reading = None
            done.set()

    async def _read(self) -> None:
        started = trio.current_time()
        view = await read_registry(self.boot, self._queue_watch)
        self.view, self.read_at_s = view, started


async def read_registry(boot: Boot, queue_watch: QueueWatch) -> RegistryView:
    """One read of what ``/metrics`` shows of the registry (reads only: a write lock held elsewhere stops none)."""
    registry = boot.registry
    return RegistryView(
        counts=await registry.counts(),
        paused=(await registry.pause_state()).paused,
        running=await registry.running_jobs(),
        outbox_depth=await registry.outbox_depth(),
        kinds={kind: dataclasses.astuple(load) for kind, load in (await queue_watch.kinds()).items()},
    )


def brought_up(view: RegistryView, known: Callable[[Job], Job]) -> RegistryView:
    """``view`` with each running job's row brought up to what this boot knows now (``Heartbeats.known``)."""
    return dataclasses.replace(view, running=[known(job) for job in view.running])
