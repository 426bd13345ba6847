"""What every part of the core shares for one boot of the supervisor: the settings, the registry, the executor, the
event bus, this boot's id, and the jobs this boot watches (``Watched``).

The parts (``_drain``, ``_monitor``, ``_reconcile``, ``_absence``, ``_sweeper``, ``_heartbeats``) each hold a
``Boot`` and nothing of each other but what they are handed; ``_supervisor.Supervisor`` wires them.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import trio

from ..domain import Config, Job, JobStatus, KindCatalog, RegistryUnavailable, SupervisorError
from ..domain._model import utc_now
from ..execution import Executor, JobHandle
from ..observe import EventBus, EventName, JobEvent, get_logger
from ..registry import Registry

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


@dataclass
class Watched:
    """A job this boot watches (one it started, or one it adopted): ``request_cancel`` stops it.

    ``handle`` is None only while the job is being started (the spawn window). ``on_cancel`` is set by the job's
    monitor while it waits for the job's end: it starts the stop then (a cancel in the spawn window is carried out
    as soon as the monitor starts).
    """

    job_id: str
    handle: JobHandle | None = None
    cancel_requested: bool = False
    on_cancel: Callable[[], None] | None = None

    def request_cancel(self) -> None:
        if self.cancel_requested:
            return
        self.cancel_requested = True
        if self.on_cancel is not None:
            self.on_cancel()


@dataclass
class Boot:
    config: Config
    kinds: KindCatalog
    registry: Registry
    executor: Executor
    events: EventBus
    boot_id: str
    # Resolved once, so that jobs' cwd and log paths stay put whatever the supervisor's cwd does later.
    data_dir: Path
    log_dir: Path
    watched: dict[str, Watched] = field(default_factory=dict)
    # Jobs being stopped because they stalled (stall_action = terminate): they end stale, not cancelled.
    stall_stops: set[str] = field(default_factory=set)
    job_nursery: trio.Nursery | None = None
    # The wall clock of every stamp the core decides with (a resubmission's not-before, the wall-clock window): one
    # seam for tests. Waits and ages are on the event loop's clock.
    wall_clock: Callable[[], datetime] = utc_now

    # The fleet's limit when it differs from this host's setting (the first recorded wins, ADR 0012). None: ours.
    fleet_max_concurrent: int | None = None
    # Whether this host may promote now: its host lease is fresh (INV-NO-PROMOTION-WITHOUT-LEASE; the fleet's).
    may_promote: Callable[[], bool] = lambda: True

    @property
    def max_concurrent(self) -> int:
        """The fleet-wide limit this host promotes under."""
        return self.fleet_max_concurrent if self.fleet_max_concurrent is not None else self.config.max_concurrent

    @property
    def host_id(self) -> str:
        return self.config.host_id

    def owns(self, job: Job) -> bool:
        """This host promoted the row (or no host was recorded: a row from before hosts), so only this host's
        evidence judges its process (ADR 0012: no host judges a process it cannot see)."""
        return job.host_id is None or job.host_id == self.config.host_id

    def nursery(self) -> trio.Nursery:
        if self.job_nursery is None:
            raise SupervisorError("the supervisor has no job nursery: call attach() first")
        return self.job_nursery

    def announce(self, job: Job, previous: str | None, reason: str | None, **extra: Any) -> None:
        """A status change, on the event bus (``job`` is the row after it): the log line is one subscriber."""
        self.events.emit(JobEvent(EventName.TRANSITION, job, previous, reason, self.boot_id, extra))

    def announce_end(self, job: Job, previous: JobStatus | None) -> None:
        self.announce(job, str(previous) if previous else None, job.error_reason, exit_code=job.exit_code)
