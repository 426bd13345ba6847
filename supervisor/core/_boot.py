"""What every part of the core shares for one boot of the supervisor (``Boot``, a value: the settings, the registry,
the executor, the event bus, this boot's id, and the three objects that change while it runs), and the error boundary
every background task uses (``boundary``).

The parts that hold a ``Boot`` (``_drain``, ``_enqueue``, ``_monitor``, ``_reconcile``, ``_silent``, ``_hosts``,
``_fleet``, ``_queue_watch``, ``_wakeups``) get everything else they use in their constructors;
``_supervisor.Supervisor`` builds them in one place, in an order with no cycle.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import trio

from ..domain import Config, Job, JobStatus, KindCatalog, RegistryUnavailable, SupervisorError, utc_now
from ..execution import Evidence, Executor
from ..observe import EventBus, EventName, JobEvent, get_logger
from ..registry import Registry
from ._ledger import JobLedger
from ._standing import Standing

log = get_logger()
T = TypeVar("T")

# How often a write that must land (a job's end) is tried again while the registry cannot take writes. At most 5 s
# apart: a job's end lands within 5 s of the registry's return, so its slot is not held long for nothing.
UNTIL_RECORDED_MIN_S = 0.5
UNTIL_RECORDED_MAX_S = 5.0


async def until_recorded(write: Callable[[], Awaitable[T]]) -> T:
    """``write()``, again and again with backoff while the registry cannot write (a full disk, a lock held too
    long): an end this boot saw is recorded once it can be (INV-TRUE-OUTCOME), never dropped, and never a reason for
    the supervisor to exit. The registry says once that writes fail and once that they work again."""
    delay_s = UNTIL_RECORDED_MIN_S
    while True:
        try:
            return await write()
        except RegistryUnavailable:
            await trio.sleep(delay_s)
            delay_s = min(delay_s * 2, UNTIL_RECORDED_MAX_S)


def log_failure(event: str, **fields: Any) -> None:
    """In an ``except`` block: log the exception being handled. A registry that cannot write now is said once per
    episode by the registry itself (``registry_writes_failing``), and the step is retried (the next wake, sweep or
    backoff): each failed step is only a DEBUG line then. Anything else is an ERROR with its traceback."""
    exc = sys.exc_info()[1]
    if isinstance(exc, RegistryUnavailable):
        log.debug(event, error=str(exc), **fields)
    else:
        log.exception(event, **fields)


# The error boundary of every background task (docs/architecture.md, "Error boundaries"). A *condition* is the world
# failing now -- the registry, the engine, a disk (SupervisorError, OSError) -- and passes: it is logged, counted and
# the step is tried again by its task. Anything else is a *bug*: it propagates, the supervisor ends (crash-only), and
# the next boot adopts its jobs. A job's own failure is neither: it is the job's row (spawn_failed, its exit).
CONDITIONS: tuple[type[BaseException], ...] = (SupervisorError, OSError)


class Tally:
    """The conditions the background tasks met, by step (``podcast_background_conditions_total``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def note(self, step: str) -> None:
        self.counts[step] = self.counts.get(step, 0) + 1


@contextlib.contextmanager
def boundary(step: str, tally: Tally | None, **fields: Any) -> Iterator[None]:
    """The error boundary of one step of a background task: a condition is logged as ``step`` (an ERROR with its
    traceback, or a DEBUG line for a registry that says its own episode: ``log_failure``) and counted, and the task
    goes on (it tries the step again at its next wake, sweep or backoff); a bug propagates."""
    try:
        yield
    except CONDITIONS:
        log_failure(step, **fields)
        if tally is not None:
            tally.note(step)


class JobTree:
    """The job nursery, given by the root of the tree once it runs (``attach``): where every monitor, start and
    operator's multi-step work runs (``run_in_tree``)."""

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    @property
    def attached(self) -> bool:
        return self._nursery is not None

    def nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise SupervisorError("the supervisor has no job nursery: call attach() first")
        return self._nursery

@dataclass(frozen=True)
class Boot:
    """One boot's settings, parts and ids: a value, made once by ``Supervisor`` and handed to every part. What
    changes while it runs lives in the three objects it holds, each written by the verbs of one owner: ``ledger``
    (the jobs watched or being started: ``_ledger``), ``standing`` (what the fleet lets this host do: the fleet
    task's), ``tree`` (the job nursery, attached by the root)."""

    config: Config
    kinds: KindCatalog
    registry: Registry
    executor: Executor
    events: EventBus
    boot_id: str
    # Resolved once, so that jobs' cwd and log paths stay put whatever the supervisor's cwd does later.
    data_dir: Path
    log_dir: Path
    standing: Standing
    ledger: JobLedger = field(default_factory=JobLedger)
    tree: JobTree = field(default_factory=JobTree)
    # The wall clock of every stamp the core decides with (a resubmission's not-before, the wall-clock window): one
    # seam for tests. Waits and ages are on the event loop's clock.
    wall_clock: Callable[[], datetime] = utc_now
    # The conditions the background tasks met (``boundary``).
    tally: Tally = field(default_factory=Tally)

    @property
    def max_concurrent(self) -> int:
        """The fleet-wide limit this host promotes under."""
        return self.standing.max_concurrent

    @property
    def host_id(self) -> str:
        return self.config.host_id

    def owns(self, job: Job) -> bool:
        """This host promoted the row (or no host was recorded: a row from before hosts), so only this host's
        evidence judges its process (ADR 0012: no host judges a process it cannot see)."""
        return job.host_id is None or job.host_id == self.config.host_id

    async def evidence(self, rows: list[Job]) -> list[Evidence]:
        """The executor's evidence for ``rows`` (blocking probes: a worker thread, never during a registry write)."""
        return await trio.to_thread.run_sync(lambda: self.executor.gather_evidence(rows, boot_id=self.boot_id))

    async def run_in_tree(self, work: Callable[[], Awaitable[T]], step: str) -> T:
        """Run ``work`` as a task of the job nursery and wait for its result. A caller that goes away (a request
        whose client hung up) cancels only its own wait: the work finishes, owned by the nursery tree, never half
        done by a task that was cancelled for a reason of its own (ADR 0014). A failure is the caller's to hear; once
        nobody waits, it meets the task's error boundary (``boundary``: logged as ``step``, or a bug that ends the
        supervisor)."""
        done = trio.Event()
        box: dict[str, Any] = {}
        waiting = True

        async def task() -> None:
            try:
                box["value"] = await work()
            except Exception as exc:
                if waiting:
                    box["error"] = exc
                    return
                with boundary(step, self.tally):
                    raise
            finally:
                done.set()

        self.tree.nursery().start_soon(task)
        try:
            await done.wait()
        except BaseException:
            waiting = False
            if "error" in box:  # it failed just as its caller went away: nobody hears it but the log
                log.error(step, error=repr(box["error"]), why="its caller went away")
            raise
        if "error" in box:
            raise box["error"]
        return box["value"]

    def announce(self, job: Job, previous: str | None, reason: str | None, **extra: Any) -> None:
        """A status change, on the event bus (``job`` is the row after it): the log line is one subscriber."""
        self.events.emit(JobEvent(EventName.TRANSITION, job, previous, reason, self.boot_id, extra))

    def announce_end(self, job: Job, previous: JobStatus | None, **extra: Any) -> None:
        self.announce(job, str(previous) if previous else None, job.error_reason, exit_code=job.exit_code, **extra)
