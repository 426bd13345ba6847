"""What a boot says of itself: its health (``health_of``) and its queue (``queue_state_of``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..domain import RegistryError, to_iso
from ._boot import Boot
from ._queue_watch import QueueWatch


@dataclass(frozen=True)
class QueueState:
    paused: bool
    running: int
    queued: int
    max_concurrent: int
    # The queue's watch as of the last sweep (docs/operations.md § The queue's watch; None/empty before the first): how
    # long the oldest job ready to run has waited, this host's last promotion, each reason promotion is held and since
    # when, and a stuck queue.
    oldest_queued_age_s: float | None = None
    last_promotion_at: str | None = None
    held: dict[str, str] = field(default_factory=dict)
    stuck: dict[str, str] | None = None
    # Each kind's running and queued jobs (fleet-wide) and its max_running (None: no limit of its own).
    kinds: dict[str, dict[str, int | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Health:
    """What the health route says: ``degraded`` names each part that does not work fully now (``registry``: its
    writes fail, so nothing new is acknowledged; reads, running jobs and their slots go on; ``engine``: the executor's
    engine does not answer, so nothing is started and running jobs' liveness is unknown; they keep their slots;
    ``queue``: the queue is stuck, docs/operations.md § The queue's watch)."""

    boot_id: str
    exec_mode: str
    paused: bool | None  # None: the registry could not be read
    degraded: dict[str, str]
    host_id: str = ""
    leader: bool = False  # this host leads the fleet (ADR 0012)

    @property
    def status(self) -> str:
        return "degraded" if self.degraded else "ok"


async def health_of(boot: Boot, queue_watch: QueueWatch) -> Health:
    """What works, and what does not; never raises for what it reports (a registry that cannot be read included)."""
    degraded: dict[str, str] = {}
    fault = boot.registry.fault()
    if fault is not None:
        degraded["registry"] = (
            f"writes failing since {fault.since.isoformat()} ({fault.failed_writes} failed): {fault.reason}"
        )
    trouble = boot.executor.fault()
    if trouble is not None:
        degraded["engine"] = (
            f"not answering since {trouble.since.isoformat()} ({trouble.failed_calls} failed calls; jobs are not "
            f"started, running ones keep their slots): {trouble.reason}"
        )
    stuck = queue_watch.rule.stuck
    # A stuck queue is still 200: a supervisor waiting for its engine must not be killed for it.
    if stuck is not None:
        degraded["queue"] = f"stuck since {stuck.since.isoformat()}: {stuck.reason}"
    paused: bool | None = None
    try:
        paused = (await boot.registry.pause_state()).paused
    except RegistryError as exc:
        degraded["registry_reads"] = str(exc)
    return Health(boot.boot_id, boot.executor.mode, paused, degraded, boot.host_id, boot.standing.may_lead())


async def queue_state_of(boot: Boot, queue_watch: QueueWatch) -> QueueState:
    """The queue now (the registry's counts and pause) and as the last sweep's watch saw it."""
    counts = await boot.registry.counts()
    paused = (await boot.registry.pause_state()).paused
    signals = queue_watch.latest
    return QueueState(
        paused,
        counts["running"],
        counts["queued"],
        boot.max_concurrent,
        signals.oldest_queued_age_s if signals else None,
        to_iso(signals.last_promotion_at) if signals else None,
        {reason: to_iso(since) for reason, since in signals.held.items()} if signals else {},
        {"reason": signals.stuck.reason, "since": to_iso(signals.stuck.since)} if signals and signals.stuck else None,
        {kind: dataclasses.asdict(load) for kind, load in (await queue_watch.kinds()).items()},
    )
